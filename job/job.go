package job

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/pgerr"
	"github.com/fencelock/fencelock/internal/validate"
)

// Job is a scheduled job that runs at most once per slot across all replicas and restarts: its
// runs are serialised by a lease of the job's name, and each slot's run is claimed, under that
// lease, in a ledger keyed by (job, slot), the table fencelock.job_runs (readable with its
// outcome in the view fencelock.job_ledger: succeeded, failed, running, crashed). A slot is any
// instant the caller names ([Job.RunSlot]); [Job.Every] names them from the database clock.
//
// A run that crashes midway (its process killed, its lease lost, its replica shut down) leaves its
// slot unfinished in the ledger: crashed. Whether that slot runs again is the job's choice:
// [WithRetryCrashed] retries it when a replica next runs the slot; by default it is not retried (at
// most once: the slot is missed). A run whose function returns an error is recorded as failed, and
// retried only with [WithRetryFailed].
//
// A Job is safe for concurrent use. The idea is ShedLock's (lockAtMostFor is the lease's TTL,
// lockAtLeastFor is [WithHoldAtLeast]), with a ledger per slot instead of a lock per job, and
// fencing tokens for the run's writes.
type Job struct {
	lessor *fencelock.Lessor
	pool   *pgxpool.Pool // the lessor's: the ledger lives beside its leases
	q      *db.Queries
	holder string // the lessor's holder id
	name   string
	ttl    time.Duration
	cfg    config
}

// New returns the job name on l, whose runs hold a lease of name for ttl: the longest a
// crashed run keeps the job from running (ShedLock's lockAtMostFor); a run's context ends when
// its lease is lost. name is 1 to [fencelock.MaxNameLength] bytes of UTF-8 without NUL (the
// lease's name: keep it apart from names used as plain leases or elections); ttl as for
// [fencelock.Lessor.Acquire].
//
// Errors: an [*fencelock.ArgumentError] (matching [fencelock.ErrInvalidArgument]) for a nil
// lessor, a bad name, ttl or option. No SQL runs.
//
// Defaults:
//   - overlap: skip a slot while another run holds the job's lease ([WithOverlapWait])
//   - hold at least: 0 ([WithHoldAtLeast])
//   - a crashed or failed slot is not run again ([WithRetryCrashed], [WithRetryFailed])
func New(l *fencelock.Lessor, name string, ttl time.Duration, opts ...Option) (*Job, error) {
	if l == nil {
		return nil, validate.Errorf("lessor", "must not be nil")
	}
	if err := validate.Name("name", name); err != nil {
		return nil, err
	}
	if err := l.CheckTTL(ttl); err != nil {
		return nil, err
	}
	var cfg config
	if err := applyAll(opts, &cfg); err != nil {
		return nil, err
	}
	return &Job{lessor: l, pool: l.Pool(), q: db.New(), holder: l.Holder(), name: name, ttl: ttl, cfg: cfg}, nil
}

// Run is one run of a [Job]'s slot, given to its function.
type Run struct {
	Slot    time.Time        // the slot, as the database stores it (microseconds)
	Attempt int              // 1 for the slot's first run, more when a crashed or failed run is retried
	Lease   *fencelock.Lease // the job's lease: its Token fences the run's writes ([fencelock.Lease.FenceTx])
}

// Func is the work of a job's slot: ctx is the lease's context ([fencelock.Lease.Context]).
type Func func(ctx context.Context, run *Run) error

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

// cleanupTimeout bounds what RunSlot does after ctx may have ended (recording the outcome,
// confirming a loss), as package fencelock bounds a release.
const cleanupTimeout = 5 * time.Second

// detached returns ctx's values without its cancellation, bounded by [cleanupTimeout].
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
}

// RunSlot runs fn for slot unless the slot has run: it takes the job's lease (waiting with
// [WithOverlapWait], else trying once), claims the slot in the ledger, runs fn under the
// lease's context, records its outcome, and releases the lease (after [WithHoldAtLeast], if set
// and fn ran; also when ctx has ended by then: the release is detached from ctx, bounded by
// 5 s of its own, as [fencelock.Lease.Release]). A slot the ledger has settled (run, running,
// or not to be run again) is found so with one read, without the lease. slot is truncated to
// microseconds, as the database keeps it.
//
// Outcomes: fn's nil is recorded as succeeded and fn's error as failed, while the lease is held
// to the end. A run that lost its lease before it returned is not recorded, nor is one whose
// ctx ended (a replica shutting down): its slot reads crashed, as if its replica had died.
//
// Errors: an [*fencelock.ArgumentError] for a nil fn, before any SQL; [ErrSlotBusy] when the
// lease is held and the policy is to skip; [ErrSlotDone] when the ledger has the slot (fn is
// not called in either case); fn's error, as is, when recorded as the run's failure; when the
// lease was lost before fn returned (or before the claim, fn not called), an error wrapping
// its [*fencelock.LeaseLostError] (matching [fencelock.ErrLeaseLost]), and fn's error too if
// it returned one; when the outcome could not be recorded, an error saying so, joined with
// fn's; ctx's error, wrapped, when ctx ends while waiting; otherwise pgx's error, wrapped
// (matching [fencelock.ErrReadOnly] on a hot standby). Safe for concurrent use.
func (j *Job) RunSlot(ctx context.Context, slot time.Time, fn Func) error {
	if fn == nil {
		return validate.Errorf("fn", "must not be nil")
	}
	slot = slot.Truncate(time.Microsecond)
	what := func() string { return fmt.Sprintf("job %q, slot %v", j.name, slot) }
	// A slot the ledger has settled needs no lease: most replicas find their slot run already,
	// and holding the lease for that would keep the job off while a replica that died holding
	// it lapses.
	settled, err := j.q.JobSettled(ctx, j.pool, db.JobSettledParams{Job: j.name, Slot: slot, RetryFailed: j.cfg.retryFailed, RetryCrashed: j.cfg.retryCrashed})
	if err != nil {
		return &errUnclaimed{pgerr.Wrap(what()+": read the ledger", err)}
	}
	if settled {
		return fmt.Errorf("%s: %w", what(), ErrSlotDone)
	}
	var lease *fencelock.Lease
	if j.cfg.wait {
		lease, err = j.lessor.Acquire(ctx, j.name, j.ttl)
	} else {
		lease, err = j.lessor.TryAcquire(ctx, j.name, j.ttl)
		if errors.Is(err, fencelock.ErrNotAcquired) {
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

	row, err := j.q.JobClaim(ctx, j.pool, db.JobClaimParams{
		Job: j.name, Holder: j.holder, Token: int64(lease.Token()), Slot: slot,
		RetryCrashed: j.cfg.retryCrashed, RetryFailed: j.cfg.retryFailed,
	})
	if err != nil {
		return &errUnclaimed{pgerr.Wrap(what()+": claim", err)}
	}
	if !row.Current {
		return &errUnclaimed{fmt.Errorf("%s: %w", what(), goneOnServer(ctx, j.pool, lease))}
	}
	if !row.Claimed {
		return fmt.Errorf("%s: %w", what(), ErrSlotDone)
	}
	ran = true
	run := &Run{Slot: slot, Attempt: int(row.Attempt), Lease: lease}
	lctx, cancel := lease.Context(ctx)
	ferr := func() error { // released on a panic too (deferred above); the panic goes on
		defer cancel()
		return fn(lctx, run)
	}()
	if lost := lease.Err(); lost != nil {
		// Not recorded: the run may have gone on without the lease; the slot reads crashed.
		if ferr == nil || errors.Is(ferr, fencelock.ErrLeaseLost) {
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
	fctx, stop := detached(ctx)
	n, rerr := j.q.JobFinish(fctx, j.pool, db.JobFinishParams{Job: j.name, Holder: j.holder, Slot: slot, Token: int64(lease.Token()), Succeeded: ferr == nil, Error: msg})
	stop()
	switch {
	case rerr != nil:
		rerr = pgerr.Wrap(what()+": record the outcome", rerr)
	case n == 0:
		rerr = fmt.Errorf("%s: outcome not recorded: %w", what(), goneOnServer(ctx, j.pool, lease))
	}
	if rerr != nil {
		return errors.Join(ferr, rerr)
	}
	return ferr
}

// errGoneOnServer is the cause of a loss the ledger's statements found, in the words of
// package fencelock's own.
var errGoneOnServer = errors.New("the database no longer has this grant (expired or taken over)")

// goneOnServer is called when a statement scoped to lease's grant (JobClaim, JobFinish) found
// that grant no longer current on the database, and returns the lease's loss, a
// [*fencelock.LeaseLostError]. A grant that is gone never comes back (its expiry never moves
// back, its token is never granted again), so the lease's own guard ([fencelock.Lease.GuardTx],
// in a transaction of its own: three statements, on this rare path only) finds it gone too,
// and ends the lease as lost: its Done closes, the lessor logs and counts the loss, and its
// heartbeat stops renewing it. When the guard cannot tell (its statements failed, or the grant
// is current after all: a ledger row deleted by hand), the loss is reported all the same and
// the lease is left to RunSlot's release.
func goneOnServer(ctx context.Context, pool *pgxpool.Pool, lease *fencelock.Lease) error {
	if err := lease.Err(); err != nil {
		return err
	}
	gctx, stop := detached(ctx)
	defer stop()
	_ = pgx.BeginFunc(gctx, pool, func(tx pgx.Tx) error { return lease.GuardTx(gctx, tx) })
	if err := lease.Err(); err != nil {
		return err
	}
	return &fencelock.LeaseLostError{Name: lease.Name(), Token: lease.Token(), Cause: errGoneOnServer}
}
