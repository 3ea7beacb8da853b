package fencelock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock/internal/db"
)

// Job is a scheduled job that runs at most once per slot across all replicas and restarts: its
// runs are serialised by a lease of the job's name, and each slot's run is claimed, under that
// lease, in a ledger keyed by (job, slot), the table fencelock.job_runs (readable with its
// outcome in the view fencelock.job_ledger: succeeded, failed, running, crashed). A slot is any
// instant the caller names ([Job.RunSlot]); [Job.Every] names them from the database clock.
//
// A run that crashes midway (its process killed, its lease lost, its replica shut down) leaves
// its slot unfinished in the ledger: crashed. Whether that slot runs again is the job's choice: [WithRetryCrashed] retries it
// when a replica next runs the slot; by default it is not retried (at most once: the slot is
// missed). A run whose function returns an error is recorded as failed, and retried only with
// [WithRetryFailed].
//
// A Job is safe for concurrent use. The idea is ShedLock's (lockAtMostFor is the lease's TTL,
// lockAtLeastFor is [WithHoldAtLeast]), with a ledger per slot instead of a lock per job, and
// fencing tokens for the run's writes.
type Job struct {
	lessor *Lessor
	name   string
	ttl    time.Duration
	cfg    jobConfig
}

// jobConfig is a Job's configuration.
type jobConfig struct {
	wait         bool          // overlap policy: wait for a run in progress (else skip)
	holdAtLeast  time.Duration // hold the lease at least this long after a run starts
	retryCrashed bool
	retryFailed  bool
}

// JobOption configures a [Job]; [NewJob] takes them. Each is validated by the constructor,
// which fails with an [*ArgumentError] on a bad one (a nil one included). An option of another
// constructor ([LessorOption], [AdvisoryOption]) does not compile here. An option is an
// immutable value: one may be passed to any number of constructors, from any goroutine.
type JobOption interface {
	applyJob(*jobConfig) error
}

// jobOption is a [JobOption].
type jobOption func(*jobConfig) error

func (o jobOption) applyJob(c *jobConfig) error { return o(c) }

// WithOverlapWait makes a run of a slot wait while another run of the job holds the job's
// lease (in the lease's queue), then run the slot unless the ledger has it. Default: skip (the
// slot is not run by this replica; if the run in progress is of another slot, this slot is
// missed unless a later RunSlot of it finds the lease free).
func WithOverlapWait() JobOption {
	return jobOption(func(c *jobConfig) error { c.wait = true; return nil })
}

// WithHoldAtLeast keeps the job's lease for at least d (a time.Duration >= 0) after a run started,
// even when the run finishes sooner, as ShedLock's lockAtLeastFor: replicas whose clocks lag
// the database's find the lease held instead of racing for a slot that was just run. The
// ledger already keeps a slot from running twice; this keeps runs of the job apart in time.
// The hold ends early when the lease is lost or the run's ctx ends; a d above the TTL holds
// as long as the heartbeat renews the lease. Default: 0.
func WithHoldAtLeast(d time.Duration) JobOption {
	return jobOption(func(c *jobConfig) error {
		if d < 0 {
			return argError("WithHoldAtLeast", "is %v; it must be >= 0", d)
		}
		c.holdAtLeast = d
		return nil
	})
}

// WithRetryCrashed runs a slot again whose run crashed (unfinished, under a grant that has
// ended), when a replica next runs that slot. The crashed run may be merely paused and still
// executing: only its fenced writes are safe against the retry. Default: a crashed slot is not
// run again.
func WithRetryCrashed() JobOption {
	return jobOption(func(c *jobConfig) error { c.retryCrashed = true; return nil })
}

// WithRetryFailed runs a slot again whose run failed (its function returned an error), when a
// replica next runs that slot. Default: a failed slot is not run again.
func WithRetryFailed() JobOption {
	return jobOption(func(c *jobConfig) error { c.retryFailed = true; return nil })
}

// NewJob returns the job name on l, whose runs hold a lease of name for ttl: the longest a
// crashed run keeps the job from running (ShedLock's lockAtMostFor); a run's context ends when
// its lease is lost. name is 1 to [MaxNameLength] bytes of UTF-8 without NUL (the lease's name:
// keep it apart from names used as plain leases or elections); ttl as for [Lessor.Acquire].
// Errors: an [*ArgumentError] for a nil lessor, a bad name, ttl or option. No SQL runs.
func NewJob(l *Lessor, name string, ttl time.Duration, opts ...JobOption) (*Job, error) {
	if l == nil {
		return nil, argError("lessor", "must not be nil")
	}
	if err := validateName("name", name); err != nil {
		return nil, err
	}
	if _, err := l.cfg.times(ttl); err != nil {
		return nil, err
	}
	var cfg jobConfig
	if err := applyAll(opts, func(o JobOption) error { return o.applyJob(&cfg) }); err != nil {
		return nil, err
	}
	return &Job{lessor: l, name: name, ttl: ttl, cfg: cfg}, nil
}

// JobRun is one run of a [Job]'s slot, given to its function.
type JobRun struct {
	Slot    time.Time // the slot, as the database stores it (microseconds)
	Attempt int       // 1 for the slot's first run, more when a crashed or failed run is retried
	Lease   *Lease    // the job's lease: its Token fences the run's writes ([Lease.FenceTx])
}

// JobFunc is the work of a job's slot: ctx is the lease's context ([Lease.Context]).
type JobFunc func(ctx context.Context, run *JobRun) error

// ErrSlotDone is returned by [Job.RunSlot] when the ledger already has the slot: run (or
// running) by a replica, or crashed or failed and not to be retried. ErrSlotBusy when another
// run of the job holds its lease and the overlap policy is to skip.
var (
	ErrSlotDone = errors.New("fencelock: slot already run")
	ErrSlotBusy = errors.New("fencelock: another run of the job holds its lease")
)

// errUnclaimed marks an error of RunSlot before its claim of the slot committed: the slot was
// not run, and Every tries it again.
type errUnclaimed struct{ err error }

func (e *errUnclaimed) Error() string { return e.err.Error() }
func (e *errUnclaimed) Unwrap() error { return e.err }

// RunSlot runs fn for slot unless the slot has run: it takes the job's lease (waiting with
// [WithOverlapWait], else trying once), claims the slot in the ledger, runs fn under the
// lease's context, records its outcome, and releases the lease (after [WithHoldAtLeast], if set
// and fn ran; also when ctx has ended by then: the release is detached from ctx, bounded by
// 5 s of its own, as [Lease.Release]). A slot the ledger has settled (run, running, or not to
// be run again) is found so with one read, without the lease. slot is truncated to
// microseconds, as the database keeps it.
//
// Outcomes: fn's nil is recorded as succeeded and fn's error as failed, while the lease is held
// to the end. A run that lost its lease before it returned is not recorded, nor is one whose
// ctx ended (a replica shutting down): its slot reads crashed, as if its replica had died.
//
// Errors: [ErrSlotBusy] when the lease is held and the policy is to skip; [ErrSlotDone] when
// the ledger has the slot (fn is not called in either case); fn's error, as is, when recorded as
// the run's failure; when the lease was lost before fn returned (or before the claim, fn not
// called), an error wrapping its [*LeaseLostError] (matching [ErrLeaseLost]), and fn's error too
// if it returned one; when the outcome could not be recorded, an error saying so, joined with
// fn's; ctx's error, wrapped, when ctx ends while waiting; otherwise pgx's error, wrapped. Safe
// for concurrent use.
func (j *Job) RunSlot(ctx context.Context, slot time.Time, fn JobFunc) error {
	if fn == nil {
		return argError("fn", "must not be nil")
	}
	slot = slot.Truncate(time.Microsecond)
	what := func() string { return fmt.Sprintf("job %q, slot %v", j.name, slot) }
	// A slot the ledger has settled needs no lease: most replicas find their slot run already,
	// and holding the lease for that would keep the job off while a replica that died holding
	// it lapses.
	settled, err := j.lessor.q.JobSettled(ctx, j.lessor.pool, db.JobSettledParams{Job: j.name, Slot: slot, RetryFailed: j.cfg.retryFailed, RetryCrashed: j.cfg.retryCrashed})
	if err != nil {
		return &errUnclaimed{wrapPg(what()+": read the ledger", err)}
	}
	if settled {
		return fmt.Errorf("%s: %w", what(), ErrSlotDone)
	}
	var lease *Lease
	if j.cfg.wait {
		lease, err = j.lessor.Acquire(ctx, j.name, j.ttl)
	} else {
		lease, err = j.lessor.TryAcquire(ctx, j.name, j.ttl)
		if errors.Is(err, ErrNotAcquired) {
			return &errUnclaimed{fmt.Errorf("%s: %w", what(), ErrSlotBusy)}
		}
	}
	if err != nil {
		return &errUnclaimed{err}
	}
	ran := false
	started := time.Now()
	defer func() {
		if hold := j.cfg.holdAtLeast - time.Since(started); ran && hold > 0 {
			t := time.NewTimer(hold)
			select {
			case <-lease.Done():
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
		// Detached from ctx, which may have ended (a replica shutting down), bounded by 5 s.
		_ = lease.Release(ctx) // after a loss, ErrNotHeld; else it expires by its TTL
	}()

	q := j.lessor.q
	row, err := q.JobClaim(ctx, j.lessor.pool, db.JobClaimParams{
		Job: j.name, Holder: j.lessor.cfg.holder, Token: int64(lease.token), Slot: slot,
		RetryCrashed: j.cfg.retryCrashed, RetryFailed: j.cfg.retryFailed,
	})
	if err != nil {
		return &errUnclaimed{wrapPg(what()+": claim", err)}
	}
	if !row.Current {
		lease.lost(errGoneOnServer)
		return &errUnclaimed{fmt.Errorf("%s: %w", what(), lease.Err())}
	}
	if !row.Claimed {
		return fmt.Errorf("%s: %w", what(), ErrSlotDone)
	}
	ran = true
	run := &JobRun{Slot: slot, Attempt: int(row.Attempt), Lease: lease}
	lctx, cancel := lease.Context(ctx)
	ferr := func() error { // released on a panic too (deferred above); the panic goes on
		defer cancel()
		return fn(lctx, run)
	}()
	if lost := lease.Err(); lost != nil {
		// Not recorded: the run may have gone on without the lease; the slot reads crashed.
		if ferr == nil || errors.Is(ferr, ErrLeaseLost) {
			return fmt.Errorf("%s: %w", what(), lost)
		}
		return fmt.Errorf("%s: %w (fn returned: %w)", what(), lost, ferr)
	}
	if ferr != nil && ctx.Err() != nil {
		// Cut short by the caller (a replica shutting down): not a failure of the job. Not
		// recorded either: the slot reads crashed, as for a replica that went away mid-run.
		return ferr
	}
	msg := ""
	if ferr != nil {
		msg = ferr.Error()
	}
	fctx, stop := detached(ctx, cleanupTimeout)
	n, rerr := q.JobFinish(fctx, j.lessor.pool, db.JobFinishParams{Job: j.name, Holder: j.lessor.cfg.holder, Slot: slot, Token: int64(lease.token), Succeeded: ferr == nil, Error: msg})
	stop()
	switch {
	case rerr != nil:
		rerr = wrapPg(what()+": record the outcome", rerr)
	case n == 0:
		lease.lost(errGoneOnServer)
		rerr = fmt.Errorf("%s: outcome not recorded: %w", what(), lease.Err())
	}
	if rerr != nil {
		return errors.Join(ferr, rerr)
	}
	return ferr
}

// Every runs fn once per slot of period every (a time.Duration of at least a millisecond, a
// whole number of microseconds) until ctx ends: slots are counted on the database clock from
// the Unix epoch (so they are aligned to UTC: a 24-hour period starts at midnight UTC), and
// every replica names the same slots whatever its own clock says; at each slot's start each
// replica calls [Job.RunSlot], and the ledger lets one of them run it.
//
// With [WithRetryCrashed] (or [WithRetryFailed]), Every runs again a crashed (failed) slot
// within the horizon below: one whose run crashed within about a TTL plus a period of the
// slot's start, including by a replica that starts after the crash. Older ones stay as they are.
//
// A slot that could not be claimed when it came (the job's lease held by a run of an earlier
// slot, or by a replica that died holding it; an error before the claim) is tried again, late,
// at the next wake (a quarter period later at most), while it is no older than the job's TTL
// plus one period, the horizon: a dead holder's lease keeps the job off for at most its TTL.
// A slot that passes its horizon unclaimed is given up and recorded as missed in the ledger,
// so every gap has its row. Late slots run in order, back to back, and a run longer than the
// period makes the next ones late, up to the horizon. A replica that starts runs from the slot
// after the ledger's latest one within the horizon (so a slot left unrun by replicas that died
// is run by the ones that replace them), else from the current slot: a first deployment runs
// no past slot. Slots may run out of order across replicas.
//
// Errors of a slot (fn's, the database's) do not stop it; onErr, if not nil, is told of each
// ([ErrSlotBusy] and [ErrSlotDone] are not errors here). It returns ctx's error; an
// [*ArgumentError] at once for a bad period or a nil fn.
func (j *Job) Every(ctx context.Context, every time.Duration, fn JobFunc, onErr func(slot time.Time, err error)) error {
	if every < time.Millisecond || every%time.Microsecond != 0 {
		return argError("every", "is %v; it must be at least 1ms and a whole number of microseconds", every)
	}
	if fn == nil {
		return argError("fn", "must not be nil")
	}
	reach := time.Duration(int64(j.ttl+every)/int64(every)) * every // the horizon's depth, on the grid
	var next time.Time                                              // the oldest slot this replica has not settled; zero: not read yet
	for n := 0; ; n++ {
		row, err := j.lessor.q.JobSlot(ctx, j.lessor.pool, every.Microseconds())
		readAt := time.Now()
		wait := time.Duration(row.UntilNextUs) * time.Microsecond
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			if onErr != nil {
				onErr(time.Time{}, wrapPg(fmt.Sprintf("job %q: read the slot", j.name), err))
			}
			wait = j.lessor.cfg.backoff(n)
		default:
			n = -1
			current := row.Slot
			if next.IsZero() {
				next = j.startSlot(ctx, current, every, reach)
			}
			for ; !next.After(current); next = next.Add(every) {
				// The horizon moves on while earlier slots run: the database clock now.
				if horizon := current.Add(time.Since(readAt) - reach); next.Before(horizon) {
					j.giveUp(ctx, next, onErr)
					if ctx.Err() != nil {
						return ctx.Err()
					}
					continue
				}
				err := j.RunSlot(ctx, next, fn)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				var unclaimed *errUnclaimed
				if errors.As(err, &unclaimed) {
					if !errors.Is(err, ErrSlotBusy) && onErr != nil {
						onErr(next, err)
					}
					break // not claimed: this slot again at the next wake
				}
				if err != nil && !errors.Is(err, ErrSlotDone) && onErr != nil {
					onErr(next, err)
				}
			}
			if !next.After(current) {
				wait = min(wait, max(every/4, time.Millisecond)) // an unclaimed slot: look again soon
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// startSlot is where a replica that starts picks up: the oldest slot within the horizon that its
// retry policy runs again, else the first slot of the grid after the ledger's latest one within
// the horizon (a row off the grid, from a RunSlot of another instant or another period, is
// rounded up onto it), else current (a first deployment runs no past slot).
func (j *Job) startSlot(ctx context.Context, current time.Time, every, reach time.Duration) time.Time {
	since := current.Add(-reach)
	row, err := j.lessor.q.JobLastSlot(ctx, j.lessor.pool, db.JobLastSlotParams{
		Job: j.name, Since: since, Until: current, RetryCrashed: j.cfg.retryCrashed, RetryFailed: j.cfg.retryFailed,
	})
	if err != nil || !row.Last.After(since.Add(-time.Microsecond)) {
		return current
	}
	// The first grid slot after last: current minus whole periods, not before last.
	next := current.Add(-current.Sub(row.Last) / every * every)
	if !next.After(row.Last) {
		next = next.Add(every)
	}
	if !row.OldestRetry.Before(since) && row.OldestRetry.Before(next) {
		// The grid slot at or before it (a slot off the grid is not Every's to run again).
		retry := current.Add(-((current.Sub(row.OldestRetry) + every - 1) / every * every))
		if retry.Before(since) {
			retry = since
		}
		next = retry
	}
	return next
}

// giveUp records slot as missed, past its horizon unclaimed.
func (j *Job) giveUp(ctx context.Context, slot time.Time, onErr func(time.Time, error)) {
	if err := j.lessor.q.JobGiveUp(ctx, j.lessor.pool, db.JobGiveUpParams{Job: j.name, Slot: slot, Holder: j.lessor.cfg.holder}); err != nil && onErr != nil {
		onErr(slot, wrapPg(fmt.Sprintf("job %q: record slot %v as missed", j.name, slot), err))
	}
}
