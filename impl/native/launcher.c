/* The device's launch thread (`impl.launcher`): a worker that issues CUDA graph launches and event records on a
 * stream, in the order the device's thread pushed them, so that the host step does not wait on the driver.
 *
 * Launcher(graph_launch, event_record, set_context, context, spin_us[, nap_us, nap_limit_us, spin_percent,
 *          lead_margin_us]) --
 *     addresses of the driver's cuGraphLaunch, cuEventRecord and cuCtxSetCurrent (or of stand-ins with their
 *     signatures: int f(void *, void *), int f(void *)), the context the worker makes current before its first call
 *     (0: none), the most the worker polls for the next job after its last one, then how long each of its naps
 *     lasts and for how long after the polling it naps (0, 0: not at all) before it sleeps, and the share of the
 *     recent step interval it may poll (percent, default 100: the cap alone), and how early its wait for a woken
 *     step's first job ends (below; -1, the default: no such wait).  The worker starts at construction.
 *     Idle, the worker polls, then naps, then sleeps.  How long it polls adapts: after a burst of jobs it polls at
 *     most ``spin_percent`` of the median interval between the starts of its last bursts (a burst: jobs each pushed
 *     within BURST_NS of the previous one's issue), capped at spin_us, and not at all while each of the recent quiets
 *     after a burst (to the next wake() or job) outlasted that poll; after a step's wake() it polls spin_us (that
 *     step is about to push).  With lead_margin_us >= 0 it first waits, blocked, for most of the time that step
 *     will take to push (at once, if it was polling when the wake came): it learns the interval from each wake()
 *     to the first job after it, and its *lead wait*
 *     ends lead_margin_us before the shortest of the last LEAD_HISTORY of them (none shorter than MIN_LEAD_WAIT_NS,
 *     none before MIN_GAPS are known), so a step's host work is not mirrored by a polling core.  A job pushed
 *     during the lead wait wakes the worker as a sleeping one is woken (one system call, counted in ``signals``).
 *     Polling or napping, it finds a pushed job by itself (a nap ends within nap_us); only
 *     a sleeping worker has to be woken, and waking it is a system call on the pushing thread (a futex wake:
 *     several microseconds on a virtual machine's host, inside the step that pays it).  The sleep is a plain
 *     condition-variable wait with no timeout: an idle worker uses no CPU, and a lost wakeup would show as a hang.
 *     graph(exec, stream) -> seq     push a graph launch; seq numbers the jobs from 1, in push order
 *     event(event, stream) -> seq    push an event record
 *     wait(seq=-1)                   return once every job up to ``seq`` (-1: every job pushed) is issued; raises
 *                                    LaunchError when any issued job failed (the first failure, kept)
 *     issued() / pushed() -> int     jobs issued (their driver call returned) / pushed so far
 *     wake()                         a step is about to push: a napping worker polls again from its next nap's end
 *                                    (no system call), a sleeping one is woken; a no-op when spin_us is 0 (the
 *                                    push itself wakes the worker)
 *     signals() -> int               how many times a pushing thread has woken the sleeping worker (a system call each)
 *     cpu_seconds() -> float         CPU time the worker has used (its polling included); after close, its total
 *     phases() -> (int, int, int, int)  where the time went, in wall ns: the worker inside the driver's calls, the
 *                                    worker polling, the pushing thread spinning in wait() for issues; jobs issued
 *     sleeps() -> int                how many times the worker has gone to its blocking wait
 *     idle_window() -> (int, int)    (median interval between burst starts in ns, 0 before there are
 *                                    MIN_GAPS; the poll after a burst in ns) as the worker last computed them
 *     lead() -> (int, int, int)      (the shortest recent wake-to-first-job interval in ns, 0 before there are
 *                                    MIN_GAPS; the last lead wait's length in ns; lead waits so far)
 *     pause() / resume()             hold issuing (tests: a job pushed and not yet issued); wait() raises while paused
 *     close()                        stop and join the worker (pushed jobs are issued first)
 *
 * Ownership: a Launcher owns its ring of jobs (host memory, its lifetime) and its worker thread.  The ring's
 * slots are written by the pushing thread only (one producer: every push holds the GIL) and read by the worker;
 * ``pushed`` is written by the producer, ``issued`` and the first error by the worker.
 *
 * Built by setup.py as the extension `runnercheck.impl.native._launcher` (impl/native/__init__.py says when and how).
 * The tests' planted bugs are not switches in this file: each is a patch applied to a copy of it
 * (tests/impl/native_plants.py).
 */
#include "arrays.h"

#include <errno.h>
#include <pthread.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

typedef int (*HandleCall)(void *handle, void *stream);
typedef int (*ContextCall)(void *context);

enum { JOB_GRAPH = 0, JOB_EVENT = 1, RING_SIZE = 1024 };
/* Burst starts the polling adapts to: the last GAP_HISTORY intervals between them, used from MIN_GAPS on.  A job
 * found within BURST_NS of the previous one's issue belongs to that burst (a step's graph launch and its marker are
 * pushed microseconds apart: their interval is not the step's). */
enum { GAP_HISTORY = 16, MIN_GAPS = 3 };
#define BURST_NS 50000LL
/* The wake-to-first-job intervals the lead wait learns from, and the shortest lead wait worth a system call. */
enum { LEAD_HISTORY = 8 };
#define MIN_LEAD_WAIT_NS 10000LL

typedef struct {
    int kind;
    void *handle;
    void *stream;
} Job;

typedef struct {
    PyObject_HEAD
    Job ring[RING_SIZE];
    atomic_uint_fast64_t pushed;
    atomic_uint_fast64_t issued;
    atomic_int stop, sleeping, paused, error_code, error_kind;
    atomic_int wanted; /* a step's wake() while the worker was not asleep: it polls again from its next nap's end */
    atomic_uint_fast64_t signals; /* wakes of the sleeping worker (a system call each) */
    atomic_uint_fast64_t error_seq;
    int woken; /* under ``mutex`` */
    pthread_mutex_t mutex;
    pthread_cond_t wake;
    pthread_t thread;
    int running;
    HandleCall graph_launch, event_record;
    ContextCall set_context;
    void *context;
    long long spin_ns, nap_ns, nap_limit_ns;
    long long spin_percent;
    long long gaps[GAP_HISTORY]; /* the worker's only */
    int gap_count;
    long long quiets[GAP_HISTORY]; /* the worker's only: from a burst's last issue to the next wake() or job */
    int quiet_count;
    atomic_llong median_gap_ns, window_ns; /* written by the worker, read by idle_window() */
    atomic_uint_fast64_t sleeps;
    long long lead_margin_ns;          /* < 0: no lead wait */
    atomic_llong wake_at_ns;           /* written by wake(): when the step that is about to push began */
    long long leads[LEAD_HISTORY];     /* the worker's only */
    int lead_count;
    atomic_llong least_lead_ns, lead_wait_ns; /* written by the worker, read by lead() */
    atomic_uint_fast64_t lead_waits;
    _Atomic double cpu_at_exit; /* the worker's CPU seconds, written by it as it exits */
    /* Where the time goes (wall ns, read by phases()): the worker inside the driver's calls and polling; the pushing
     * thread spinning in wait() until the worker has issued (CPU the step spends on the worker's behalf). */
    atomic_llong issue_ns, poll_ns, caller_wait_ns;
} Launcher;

static PyObject *LaunchError;

static double thread_cpu_seconds(clockid_t clock)
{
    struct timespec t;
    if (clock_gettime(clock, &t) != 0)
        return -1.0;
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* End a polling spell that began at ``*since`` (0: none running) at ``now``: its length goes to ``poll_ns``. */
static inline void end_poll(Launcher *l, long long *since, long long now)
{
    if (*since) {
        atomic_fetch_add(&l->poll_ns, now - *since);
        *since = 0;
    }
}

static void note_error(Launcher *l, int code, int kind, uint64_t seq)
{
    int none = 0;
    if (atomic_compare_exchange_strong(&l->error_code, &none, code)) {
        atomic_store(&l->error_kind, kind);
        atomic_store(&l->error_seq, seq);
    }
}

/* Wake the sleeping worker: one signal (a system call) unless one is already on its way. */
static void wake_worker(Launcher *l)
{
    pthread_mutex_lock(&l->mutex);
    if (!l->woken) {
        l->woken = 1;
        atomic_fetch_add(&l->signals, 1);
        pthread_cond_signal(&l->wake);
    }
    pthread_mutex_unlock(&l->mutex);
}

/* One nap of ``ns`` nanoseconds (the worker's timer slack is set small: `work`). */
static void nap(long long ns)
{
    struct timespec t = {ns / 1000000000LL, ns % 1000000000LL};
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &t, &t) == EINTR)
        ;
}

/* The least of ``values[0..n)`` (n >= 1): once a burst, not per poll. */
static long long least_of(const long long *values, int n)
{
    long long least = values[0];
    for (int i = 1; i < n; i++)
        least = values[i] < least ? values[i] : least;
    return least;
}

/* Record one interval between burst starts and the quiet before this burst (from the last burst's last issue to the
 * first wake() or job after it), and return the poll after a burst: spin_percent of the median of the recent
 * intervals, at most spin_ns (spin_ns itself until there are MIN_GAPS of them) -- and 0 when each recent quiet
 * outlasted that poll: polling after a burst would not have caught the next step, which wakes the sleeping worker
 * itself, so the worker sleeps at once. */
static long long adapt_window(Launcher *l, long long gap, long long quiet)
{
    l->quiets[l->quiet_count % GAP_HISTORY] = quiet;
    l->quiet_count++;
    l->gaps[l->gap_count % GAP_HISTORY] = gap;
    l->gap_count++;
    const int n = l->gap_count < GAP_HISTORY ? l->gap_count : GAP_HISTORY;
    if (n < MIN_GAPS)
        return l->spin_ns;
    long long sorted[GAP_HISTORY];
    for (int i = 0; i < n; i++) { /* insertion sort of at most 16: once a burst, not per poll */
        long long v = l->gaps[i];
        int j = i;
        for (; j > 0 && sorted[j - 1] > v; j--)
            sorted[j] = sorted[j - 1];
        sorted[j] = v;
    }
    const long long median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    atomic_store(&l->median_gap_ns, median);
    const long long share = median / 100 * l->spin_percent;
    const long long poll = share < l->spin_ns ? share : l->spin_ns;
    return least_of(l->quiets, n) > poll ? 0 : poll;
}

/* Record one wake-to-first-job interval (the step's host work before its push). */
static void note_lead(Launcher *l, long long lead)
{
    l->leads[l->lead_count % LEAD_HISTORY] = lead;
    l->lead_count++;
    const int n = l->lead_count < LEAD_HISTORY ? l->lead_count : LEAD_HISTORY;
    if (n >= MIN_GAPS)
        atomic_store(&l->least_lead_ns, least_of(l->leads, n));
}

/* The lead wait after a step's wake(): blocked until lead_margin_ns before the shortest recent wake-to-first-job
 * interval has passed since that wake, or until a push, wake(), resume() or close() ends it (``sleeping`` is set,
 * so a push wakes it as it wakes a sleeping worker).  Returns at once when off, unlearnt or shorter than
 * MIN_LEAD_WAIT_NS. */
static void lead_wait(Launcher *l, uint64_t done)
{
    const long long least = atomic_load(&l->least_lead_ns);
    if (l->lead_margin_ns < 0 || least == 0)
        return;
    const long long deadline = atomic_load(&l->wake_at_ns) + least - l->lead_margin_ns;
    const long long length = deadline - now_ns();
    if (length < MIN_LEAD_WAIT_NS)
        return;
    const struct timespec until = {deadline / 1000000000LL, deadline % 1000000000LL};
    pthread_mutex_lock(&l->mutex);
    atomic_store(&l->sleeping, 1);
    atomic_store(&l->lead_wait_ns, length);
    atomic_fetch_add(&l->lead_waits, 1);
    while (!l->woken && !atomic_load(&l->stop) && atomic_load(&l->pushed) == done)
        if (pthread_cond_timedwait(&l->wake, &l->mutex, &until) == ETIMEDOUT)
            break;
    l->woken = 0;
    atomic_store(&l->sleeping, 0);
    pthread_mutex_unlock(&l->mutex);
}

/* The worker: issue every pushed job in order, poll ``window`` after the last (after a burst `adapt_window`'s share
 * of the burst interval; after a wake ``spin_ns``), nap ``nap_ns`` at a time for ``nap_limit_ns`` more (a step's
 * wake() or a pushed job found after a nap: it polls again), then sleep until a push, wake(), resume() or close()
 * wakes it.  The sleep is the other half of the producer's (store ``pushed``, load ``sleeping``): both sequentially
 * consistent, so either the worker sees the job before it sleeps or the producer sees it asleep and wakes it. */
static void *work(void *arg)
{
    Launcher *l = arg;
#ifdef __linux__
    if (l->nap_ns > 0 || l->lead_margin_ns >= 0)
        prctl(PR_SET_TIMERSLACK, 1000UL); /* a nap or lead wait ends within a microsecond of its time, not 50 */
#endif
    if (l->set_context != NULL && l->context != NULL) {
        int code = l->set_context(l->context);
        if (code)
            note_error(l, code, -1, 0);
    }
    uint64_t done = atomic_load(&l->issued);
    long long idle_since = now_ns();
    long long window = l->spin_ns; /* this idle spell's polling */
    long long burst_start = 0;     /* when the current burst's first job was found (0: none yet) */
    long long last_issue = 0;      /* when the last job was issued (a wake or a sleep does not move it) */
    long long polling_since = 0;   /* when the current polling spell began (0: not polling) */
    atomic_store(&l->window_ns, window);
    while (!atomic_load(&l->stop) || atomic_load(&l->pushed) != done) {
        uint64_t pushed = atomic_load(&l->pushed);
        if (pushed != done && !atomic_load(&l->paused)) {
            const long long found = now_ns();
            end_poll(l, &polling_since, found);
            if (burst_start == 0 || found - last_issue > BURST_NS) { /* a new burst */
                const long long asked = atomic_load(&l->wake_at_ns);
                const int woke = asked > last_issue && asked <= found; /* a wake() since the last burst */
                if (woke)
                    note_lead(l, found - asked);
                if (burst_start != 0) {
                    window = adapt_window(l, found - burst_start, (woke ? asked : found) - last_issue);
                    atomic_store(&l->window_ns, window);
                }
                burst_start = found;
            }
            const long long issuing = now_ns();
            while (done != pushed) {
                Job job = l->ring[done % RING_SIZE];
                int code = job.kind == JOB_GRAPH ? l->graph_launch(job.handle, job.stream)
                                                 : l->event_record(job.handle, job.stream);
                done++;
                if (code)
                    note_error(l, code, job.kind, done);
                atomic_store(&l->issued, done);
            }
            atomic_store(&l->wanted, 0); /* the step that asked is pushing: polling from here serves it */
            idle_since = last_issue = now_ns();
            atomic_fetch_add(&l->issue_ns, last_issue - issuing);
            continue;
        }
        const long long now = now_ns();
        const long long idle = now - idle_since;
        if (idle < window) {
            if (l->lead_margin_ns >= 0 && atomic_load(&l->wanted)) { /* a step began while it polled */
                end_poll(l, &polling_since, now);
                atomic_store(&l->wanted, 0);
                lead_wait(l, done);
                idle_since = now_ns();
                window = l->spin_ns;
                continue;
            }
            if (!polling_since)
                polling_since = now;
            relax();
            continue;
        }
        end_poll(l, &polling_since, now);
        if (idle < window + l->nap_limit_ns && !atomic_load(&l->stop)) {
            if (atomic_exchange(&l->wanted, 0)) {
                lead_wait(l, done); /* a step began: wait out most of its host work, then poll the whole cap */
                idle_since = now_ns();
                window = l->spin_ns;
            } else {
                nap(l->nap_ns);
            }
            continue;
        }
        pthread_mutex_lock(&l->mutex);
        atomic_store(&l->sleeping, 1);
        const int sleeps = !l->woken && !atomic_load(&l->stop) && !atomic_load(&l->wanted)
                           && (atomic_load(&l->pushed) == done || atomic_load(&l->paused));
        if (sleeps)
            atomic_fetch_add(&l->sleeps, 1);
        while (!l->woken && !atomic_load(&l->stop) && !atomic_load(&l->wanted)
               && (atomic_load(&l->pushed) == done || atomic_load(&l->paused)))
            pthread_cond_wait(&l->wake, &l->mutex); /* no timeout: woken by a push, wake(), resume() or close() */
        l->woken = 0;
        /* Woken by a step's wake() (or by its push): that step's jobs come now, so poll the whole cap for them. */
        atomic_store(&l->wanted, 0);
        atomic_store(&l->sleeping, 0);
        pthread_mutex_unlock(&l->mutex);
        if (atomic_load(&l->pushed) == done)
            lead_wait(l, done); /* woken by a step's wake(), not by its push */
        idle_since = now_ns();
        window = l->spin_ns;
    }
    end_poll(l, &polling_since, now_ns());
    atomic_store(&l->cpu_at_exit, thread_cpu_seconds(CLOCK_THREAD_CPUTIME_ID));
    return NULL;
}

static int address(PyObject *obj, void **out)
{
    unsigned long long value = PyLong_AsUnsignedLongLong(obj);
    if (value == (unsigned long long)-1 && PyErr_Occurred())
        return 0;
    *out = (void *)(uintptr_t)value;
    return 1;
}

static int Launcher_init(Launcher *self, PyObject *args, PyObject *kwds)
{
    (void)kwds;
    PyObject *graph_obj, *event_obj, *context_call_obj, *context_obj;
    long long spin_us, nap_us = 0, nap_limit_us = 0, spin_percent = 100, lead_margin_us = -1;
    if (self->running) {
        PyErr_SetString(PyExc_RuntimeError, "Launcher already started");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOOL|LLLL", &graph_obj, &event_obj, &context_call_obj, &context_obj, &spin_us, &nap_us,
                          &nap_limit_us, &spin_percent, &lead_margin_us))
        return -1;
    void *graph, *event, *context_call, *context;
    if (!address(graph_obj, &graph) || !address(event_obj, &event) || !address(context_call_obj, &context_call)
        || !address(context_obj, &context))
        return -1;
    if (graph == NULL || event == NULL || spin_us < 0) {
        PyErr_SetString(PyExc_ValueError, "Launcher needs its two calls' addresses and spin_us >= 0");
        return -1;
    }
    /* A nap of 0 would poll as fast as the polling does, through a system call; the limit keeps the sums in range. */
    if (nap_limit_us < 0 || nap_us < 0 || (nap_limit_us > 0 && nap_us == 0) || nap_us > 1000000 || nap_limit_us > 3600000000LL
        || spin_us > 3600000000LL) {
        PyErr_SetString(PyExc_ValueError, "Launcher needs 0 <= nap_us <= 1e6 (> 0 with a nap limit), "
                                          "0 <= nap_limit_us <= 3.6e9 and spin_us <= 3.6e9");
        return -1;
    }
    if (spin_percent < 1 || spin_percent > 100) {
        PyErr_SetString(PyExc_ValueError, "Launcher needs 1 <= spin_percent <= 100");
        return -1;
    }
    if (lead_margin_us < -1 || lead_margin_us > 1000000) {
        PyErr_SetString(PyExc_ValueError, "Launcher needs -1 <= lead_margin_us <= 1e6 (-1: no lead wait)");
        return -1;
    }
    self->graph_launch = (HandleCall)graph;
    self->event_record = (HandleCall)event;
    self->set_context = (ContextCall)context_call;
    self->context = context;
    self->spin_ns = spin_us * 1000;
    self->nap_ns = nap_us * 1000;
    self->nap_limit_ns = nap_limit_us * 1000;
    self->spin_percent = spin_percent;
    self->lead_margin_ns = lead_margin_us < 0 ? -1 : lead_margin_us * 1000;
    self->lead_count = 0;
    atomic_store(&self->wake_at_ns, 0);
    atomic_store(&self->least_lead_ns, 0);
    atomic_store(&self->lead_wait_ns, 0);
    atomic_store(&self->lead_waits, 0);
    self->gap_count = 0;
    self->quiet_count = 0;
    atomic_store(&self->median_gap_ns, 0);
    atomic_store(&self->window_ns, self->spin_ns);
    atomic_store(&self->sleeps, 0);
    atomic_store(&self->pushed, 0);
    atomic_store(&self->issued, 0);
    atomic_store(&self->stop, 0);
    atomic_store(&self->sleeping, 0);
    atomic_store(&self->paused, 0);
    atomic_store(&self->wanted, 0);
    atomic_store(&self->signals, 0);
    atomic_store(&self->error_code, 0);
    atomic_store(&self->error_kind, 0);
    atomic_store(&self->error_seq, 0);
    atomic_store(&self->cpu_at_exit, 0.0);
    atomic_store(&self->issue_ns, 0);
    atomic_store(&self->poll_ns, 0);
    atomic_store(&self->caller_wait_ns, 0);
    self->woken = 0;
    pthread_mutex_init(&self->mutex, NULL);
    pthread_condattr_t monotonic; /* the lead wait's deadline is on CLOCK_MONOTONIC, as now_ns() */
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&self->wake, &monotonic);
    pthread_condattr_destroy(&monotonic);
    int failed = pthread_create(&self->thread, NULL, work, self);
    if (failed) {
        pthread_cond_destroy(&self->wake);
        pthread_mutex_destroy(&self->mutex);
        errno = failed;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->running = 1;
    return 0;
}

static void stop_worker(Launcher *self)
{
    if (!self->running)
        return;
    atomic_store(&self->paused, 0);
    atomic_store(&self->stop, 1);
    wake_worker(self);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(self->thread, NULL);
    Py_END_ALLOW_THREADS
    self->running = 0;
    pthread_cond_destroy(&self->wake);
    pthread_mutex_destroy(&self->mutex);
}

static void Launcher_dealloc(Launcher *self)
{
    stop_worker(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *push(Launcher *self, PyObject *args, int kind)
{
    PyObject *handle_obj, *stream_obj;
    void *handle, *stream;
    if (!PyArg_ParseTuple(args, "OO", &handle_obj, &stream_obj) || !address(handle_obj, &handle)
        || !address(stream_obj, &stream))
        return NULL;
    if (!self->running) {
        PyErr_SetString(LaunchError, "push to a closed launch thread");
        return NULL;
    }
    uint64_t seq = atomic_load(&self->pushed);
    while (seq - atomic_load(&self->issued) >= RING_SIZE) { /* full: the worker is behind by a whole ring */
        if (atomic_load(&self->paused)) {
            PyErr_SetString(LaunchError, "the launch thread's ring is full while it is paused");
            return NULL;
        }
        if (atomic_load(&self->sleeping))
            wake_worker(self);
        relax();
    }
    self->ring[seq % RING_SIZE] = (Job){kind, handle, stream};
    atomic_store(&self->pushed, seq + 1);
    if (atomic_load(&self->sleeping))
        wake_worker(self);
    return PyLong_FromUnsignedLongLong(seq + 1);
}

static PyObject *Launcher_graph(Launcher *self, PyObject *args) { return push(self, args, JOB_GRAPH); }

static PyObject *Launcher_event(Launcher *self, PyObject *args) { return push(self, args, JOB_EVENT); }

static uint64_t issued_count(Launcher *self)
{
    return atomic_load(&self->issued);
}

static PyObject *raise_error(Launcher *self)
{
    int kind = atomic_load(&self->error_kind);
    const char *what = kind == JOB_GRAPH ? "cuGraphLaunch" : kind == JOB_EVENT ? "cuEventRecord" : "cuCtxSetCurrent";
    PyErr_Format(LaunchError, "%s returned CUresult %d (launch-thread job %llu)", what, atomic_load(&self->error_code),
                 (unsigned long long)atomic_load(&self->error_seq));
    return NULL;
}

static PyObject *Launcher_wait(Launcher *self, PyObject *args)
{
    long long wanted = -1;
    if (!PyArg_ParseTuple(args, "|L", &wanted))
        return NULL;
    uint64_t seq = wanted < 0 ? atomic_load(&self->pushed) : (uint64_t)wanted;
    if (seq > atomic_load(&self->pushed)) {
        PyErr_Format(PyExc_ValueError, "wait for job %llu, but only %llu were pushed", (unsigned long long)seq,
                     (unsigned long long)atomic_load(&self->pushed));
        return NULL;
    }
    if (atomic_load(&self->issued) < seq) {
        if (atomic_load(&self->paused) || !self->running) {
            PyErr_SetString(LaunchError, "wait on a paused or closed launch thread");
            return NULL;
        }
        Py_BEGIN_ALLOW_THREADS
        const long long began = now_ns();
        int asked = 0; /* one wake: a woken worker issues before it can sleep again (the pushes woke it already) */
        while (atomic_load(&self->issued) < seq) {
            if (!asked && atomic_load(&self->sleeping)) {
                wake_worker(self);
                asked = 1;
            }
            relax();
        }
        atomic_fetch_add(&self->caller_wait_ns, now_ns() - began);
        Py_END_ALLOW_THREADS
    }
    if (atomic_load(&self->error_code))
        return raise_error(self);
    Py_RETURN_NONE;
}

static PyObject *Launcher_issued(Launcher *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(issued_count(self));
}

static PyObject *Launcher_pushed(Launcher *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(atomic_load(&self->pushed));
}

static PyObject *Launcher_wake(Launcher *self, PyObject *unused)
{
    (void)unused;
    /* A worker that never polls (spin_us 0) has nothing to get ready for: the step's push wakes it, and a wake now
     * would cost a system call only for the worker to go back to sleep. */
    if (!self->running || self->spin_ns == 0)
        Py_RETURN_NONE;
    atomic_store(&self->wake_at_ns, now_ns()); /* before ``wanted``: a worker that sees the wake sees its time */
    atomic_store(&self->wanted, 1); /* seen at a nap's end; before the load below, so a worker going to sleep clears it */
    if (atomic_load(&self->sleeping))
        wake_worker(self);
    Py_RETURN_NONE;
}

static PyObject *Launcher_signals(Launcher *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(atomic_load(&self->signals));
}

static PyObject *Launcher_sleeps(Launcher *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(atomic_load(&self->sleeps));
}

static PyObject *Launcher_idle_window(Launcher *self, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("(LL)", (long long)atomic_load(&self->median_gap_ns), (long long)atomic_load(&self->window_ns));
}

static PyObject *Launcher_lead(Launcher *self, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("(LLK)", (long long)atomic_load(&self->least_lead_ns), (long long)atomic_load(&self->lead_wait_ns),
                         (unsigned long long)atomic_load(&self->lead_waits));
}

static PyObject *Launcher_phases(Launcher *self, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("(LLLK)", (long long)atomic_load(&self->issue_ns), (long long)atomic_load(&self->poll_ns),
                         (long long)atomic_load(&self->caller_wait_ns), (unsigned long long)atomic_load(&self->issued));
}

static PyObject *Launcher_cpu_seconds(Launcher *self, PyObject *unused)
{
    (void)unused;
    if (!self->running)
        return PyFloat_FromDouble(atomic_load(&self->cpu_at_exit));
    clockid_t clock;
    const int failed = pthread_getcpuclockid(self->thread, &clock);
    const double seconds = failed ? -1.0 : thread_cpu_seconds(clock);
    if (seconds < 0) {
        errno = failed ? failed : errno;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyFloat_FromDouble(seconds);
}

static PyObject *Launcher_pause(Launcher *self, PyObject *unused)
{
    (void)unused;
    atomic_store(&self->paused, 1);
    Py_RETURN_NONE;
}

static PyObject *Launcher_resume(Launcher *self, PyObject *unused)
{
    (void)unused;
    atomic_store(&self->paused, 0);
    if (self->running)
        wake_worker(self);
    Py_RETURN_NONE;
}

static PyObject *Launcher_close(Launcher *self, PyObject *unused)
{
    (void)unused;
    stop_worker(self);
    if (atomic_load(&self->error_code))
        return raise_error(self);
    Py_RETURN_NONE;
}

static PyMethodDef Launcher_methods[] = {
    {"graph", (PyCFunction)Launcher_graph, METH_VARARGS, "Push a graph launch (exec, stream); returns its job number."},
    {"event", (PyCFunction)Launcher_event, METH_VARARGS, "Push an event record (event, stream); returns its job number."},
    {"wait", (PyCFunction)Launcher_wait, METH_VARARGS, "Return once the jobs up to seq (-1: all) are issued."},
    {"issued", (PyCFunction)Launcher_issued, METH_NOARGS, "Jobs issued so far."},
    {"pushed", (PyCFunction)Launcher_pushed, METH_NOARGS, "Jobs pushed so far."},
    {"wake", (PyCFunction)Launcher_wake, METH_NOARGS, "A step is about to push: end the worker's nap or sleep."},
    {"signals", (PyCFunction)Launcher_signals, METH_NOARGS, "Wakes of the sleeping worker so far (a system call each)."},
    {"sleeps", (PyCFunction)Launcher_sleeps, METH_NOARGS, "Times the worker has gone to its blocking wait."},
    {"idle_window", (PyCFunction)Launcher_idle_window, METH_NOARGS,
     "(median interval between burst starts, the poll after a burst), in ns."},
    {"lead", (PyCFunction)Launcher_lead, METH_NOARGS,
     "(shortest recent wake-to-first-job interval, the last lead wait), in ns, and lead waits so far."},
    {"phases", (PyCFunction)Launcher_phases, METH_NOARGS,
     "(ns in the driver's calls, ns polling, ns the pushing thread spun in wait for issues, jobs issued)."},
    {"cpu_seconds", (PyCFunction)Launcher_cpu_seconds, METH_NOARGS, "CPU time the worker has used, its polling included."},
    {"pause", (PyCFunction)Launcher_pause, METH_NOARGS, "Hold issuing (tests)."},
    {"resume", (PyCFunction)Launcher_resume, METH_NOARGS, "Issue again."},
    {"close", (PyCFunction)Launcher_close, METH_NOARGS, "Issue what was pushed, stop and join the worker."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = STRINGIFY(MODULE_NAME) ".Launcher",
    .tp_basicsize = sizeof(Launcher),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A worker thread issuing graph launches and event records in push order.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Launcher_init,
    .tp_dealloc = (destructor)Launcher_dealloc,
    .tp_methods = Launcher_methods,
};

static PyMethodDef methods[] = {{NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, STRINGIFY(MODULE_NAME), "The device's launch thread.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC CONCAT(PyInit_, MODULE_NAME)(void)
{
    if (PyType_Ready(&LauncherType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddStringConstant(m, "source_sha", RUNNERCHECK_SOURCE_SHA) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    LaunchError = PyErr_NewException(STRINGIFY(MODULE_NAME) ".LaunchError", PyExc_RuntimeError, NULL);
    if (LaunchError == NULL || PyModule_AddObject(m, "LaunchError", LaunchError) < 0) {
        Py_XDECREF(LaunchError);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&LauncherType);
    if (PyModule_AddObject(m, "Launcher", (PyObject *)&LauncherType) < 0) {
        Py_DECREF(&LauncherType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
