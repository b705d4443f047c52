"""What renders a run's findings: the verify/stress summary (`summary`: summary.json and summary.md),
terminal tables (`render`), JUnit cases (`junit_cases`) and progress (`progress`)."""
