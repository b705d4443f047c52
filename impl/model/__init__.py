"""The built-in decoder: config and weights (`weights`), and its paged forward."""
