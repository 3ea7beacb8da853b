package gooselock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pressly/goose/v3/lock"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/validate"
)

var _ lock.Locker = (*Locker)(nil)

// Locker is goose v3's [lock.Locker] backed by a lease of a [fencelock.Lessor]: it lets goose
// migrators take turns through the lease's queue instead of a session advisory lock or goose's
// lock table. Pass it to goose.NewProvider with goose.WithLocker:
//
//	locker, err := gooselock.New(lessor, "migrations:app", 30*time.Second)
//	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithLocker(locker))
//	ctx, cancel := locker.Context(ctx) // cancelled if the lease is lost mid-run
//	defer cancel()
//	_, err = p.Up(ctx)
//
// Unlike goose's session locker ([lock.NewPostgresSessionLocker], a pg_advisory_lock on one
// connection), it works behind PgBouncer in transaction mode, where a session lock stays on
// whatever server connection ran the locking statement (pressly/goose#972). Unlike goose's table
// locker ([lock.NewPostgresTableLocker], which retries every 5 s), a waiter is woken by the release
// itself (LISTEN/NOTIFY; polling with the lessor's [fencelock.Backoff] behind a pooler). The lease
// is renewed by the lessor's heartbeat while migrations run, so the TTL bounds how long a crashed
// migrator keeps the others out, not how long migrations may take.
//
// The *sql.DB that goose passes to Lock and Unlock is ignored: the lease lives on the lessor's
// pool, not on goose's db. The two may be different pools of the same database, or even
// different databases: the lease guards the migration run, whichever database its statements
// go to, provided every migrator takes the same lease name from the same lease database.
//
// The lease is a lock, not a fence: goose's migration transactions do not check its fencing
// token. See [Locker.Context] for what a lost lease does to a run in progress.
//
// A Locker holds at most one lease at a time. It is safe for concurrent use, but it is not a queue
// of its own: a Lock while another Lock of the same Locker holds the lease or waits for it fails at
// once with [fencelock.ErrAlreadyHeld] (a goose Provider serialises its own calls to Lock and
// Unlock, from one goroutine at a time). Migrators that must wait for each other need a Locker
// each, on lessors with distinct holder ids: one per process.
//
// The idea is goose's: the lock.Locker interface, added to goose v3 by pressly/goose#993 to
// fix #972.
type Locker struct {
	lessor *fencelock.Lessor
	name   string
	ttl    time.Duration

	mu      sync.Mutex
	locking bool             // a Lock is waiting for the lease
	held    *fencelock.Lease // the lease of the last successful Lock, until Unlock
	last    *fencelock.Lease // the lease of the last successful Lock, kept after Unlock (Done, Err)
	changed chan struct{}    // closed, and replaced, whenever held changes (Context's watchers)
}

// noLease is Done's channel before the first Lock: closed, since nothing is held.
var noLease = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// New returns a goose [lock.Locker] that takes the lease name of l for ttl on each Lock. name is 1
// to [fencelock.MaxNameLength] bytes of UTF-8 without NUL; ttl is a time.Duration between
// [fencelock.MinTTL] and [fencelock.MaxTTL], measured on the database clock (Postgres rounds it to
// microseconds), and must suit l's heartbeat and safety margin, as for [fencelock.Lessor.Acquire].
//
// Errors: an [*fencelock.ArgumentError] (matching [fencelock.ErrInvalidArgument]) for a nil lessor,
// a bad name or a bad ttl. No SQL runs.
func New(l *fencelock.Lessor, name string, ttl time.Duration) (*Locker, error) {
	if l == nil {
		return nil, validate.Errorf("lessor", "must not be nil")
	}
	if err := validate.Name("name", name); err != nil {
		return nil, err
	}
	if err := l.CheckTTL(ttl); err != nil {
		return nil, err
	}
	return &Locker{lessor: l, name: name, ttl: ttl, changed: make(chan struct{})}, nil
}

// Lock takes the lease with [fencelock.Lessor.Acquire]: it waits in the name's queue, first come,
// first served, until the lease is granted or ctx ends. The db argument is ignored (see [Locker]).
// goose calls it at the start of Up, Down and the other calls that apply migrations.
//
// Errors: an error wrapping [fencelock.ErrAlreadyHeld] when this Locker already holds the lease
// (until Unlock, even once the lease is lost) or another Lock of it is waiting; otherwise as for
// [fencelock.Lessor.Acquire]: ctx's error, wrapped, when ctx ends first, with nothing held and no
// place left in the queue.
func (g *Locker) Lock(ctx context.Context, _ *sql.DB) error {
	g.mu.Lock()
	if g.held != nil || g.locking {
		g.mu.Unlock()
		return fmt.Errorf("goose lock %q: %w", g.name, fencelock.ErrAlreadyHeld)
	}
	g.locking = true
	g.mu.Unlock()

	lease, err := g.lessor.Acquire(ctx, g.name, g.ttl)

	g.mu.Lock()
	defer g.mu.Unlock()
	g.locking = false
	if err != nil {
		return err
	}
	g.held, g.last = lease, lease
	g.changedLocked()
	return nil
}

// Unlock releases the lease taken by Lock with [fencelock.Lease.Release], which hands it to the
// next waiter, if any. The db argument is ignored (see [Locker]). goose calls it when the run ends
// and adds its error to the run's. Unlock runs even when ctx has ended (goose may pass the context
// of a run that was cancelled or timed out; its locktesting.TestConcurrentLocking unlocks with the
// Lock context past its deadline): the release keeps ctx's values but not its cancellation or
// deadline, and is bounded by 5 s of its own, as goose's own table locker detaches its Unlock from
// ctx.
//
// Errors: an error wrapping [fencelock.ErrNotHeld] when no Lock holds the lease. When the lease was
// lost before Unlock (its trust window ended without a renewal, or a renewal found it gone), Unlock
// still releases it on the server, scoped to its grant so that it never frees a newer holder's, and
// returns an error wrapping both [fencelock.ErrNotHeld] and the lease's [*fencelock.LeaseLostError]
// (matching [fencelock.ErrLeaseLost]), joined with the release's own error when that is another
// one: goose's Up then fails, even if every migration was applied, since some may have run without
// the lease. Otherwise Release's errors: one wrapping [fencelock.ErrNotHeld] when the grant had
// already expired or been taken over on the database, or the pgx error, wrapped. After Unlock, held
// or not, the Locker may Lock again.
func (g *Locker) Unlock(ctx context.Context, _ *sql.DB) error {
	g.mu.Lock()
	lease := g.held
	if lease != nil {
		g.held = nil
		g.changedLocked() // before the release closes lease.Done(): see watch
	}
	g.mu.Unlock()
	if lease == nil {
		return fmt.Errorf("unlock goose lock %q: %w", g.name, fencelock.ErrNotHeld)
	}
	relErr := lease.Release(ctx)
	// Release ends the lease with ErrReleased unless it had ended already, lost.
	if lost := lease.Err(); errors.Is(lost, fencelock.ErrLeaseLost) {
		err := fmt.Errorf("unlock goose lock %q: %w: %w", g.name, fencelock.ErrNotHeld, lost)
		if relErr != nil && !errors.Is(relErr, fencelock.ErrNotHeld) {
			return errors.Join(err, relErr)
		}
		return err
	}
	return relErr
}

// changedLocked wakes Context's watchers: held has changed. g.mu must be held.
func (g *Locker) changedLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// Done returns the [fencelock.Lease.Done] channel of the lease of the last successful Lock: it
// closes when that lease's trust window ends without a renewal, when a renewal finds it lost, or
// when Unlock releases it. Before the first Lock it returns a closed channel: nothing is held. It
// never reopens; a later Lock's lease has a channel of its own, so call Done again after Lock.
func (g *Locker) Done() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.last == nil {
		return noLease
	}
	return g.last.Done()
}

// Err returns the [fencelock.Lease.Err] of the lease of the last successful Lock: nil while it is
// held and trusted; [fencelock.ErrReleased] once Unlock released it; a [*fencelock.LeaseLostError]
// (matching [fencelock.ErrLeaseLost]) once it was lost. Before the first Lock it returns an error
// wrapping [fencelock.ErrNotHeld]. Like [fencelock.Lease.Err] it reads the local clock: past the
// end of the trust window it reports the loss at once, even if the trust watch's timer has not
// fired yet.
func (g *Locker) Err() error {
	g.mu.Lock()
	last := g.last
	g.mu.Unlock()
	if last == nil {
		return fmt.Errorf("goose lock %q: %w", g.name, fencelock.ErrNotHeld)
	}
	return last.Err()
}

// Context returns a copy of parent that is cancelled, with cause the lease's
// [*fencelock.LeaseLostError] (matching [fencelock.ErrLeaseLost]; read it with [context.Cause]),
// when a lease that a Lock of this Locker holds while the context is live is lost. A release by
// Unlock does not cancel it, and a Lock made after Context was called is watched too: goose
// receives its context in Up before it calls Lock, so create the context first and pass it to Up:
//
//	ctx, cancel := locker.Context(ctx)
//	defer cancel()
//	results, err := provider.Up(ctx)
//
// goose hands that context to Lock, then to every statement and transaction of the run. A
// loss therefore cancels the migration in flight (pgx cancels its statement on the server and
// database/sql rolls its transaction back) and Up returns an error (a *goose.PartialError when
// the run stopped in a migration) without starting the next migration; Unlock's error, which
// goose adds to Up's, says the lease was lost. Without it, goose goes on applying migrations
// after a loss, and only Unlock's error tells.
//
// This is a best effort, not a fence: goose's migrations do not check the lease's fencing
// token. The trust window ends the safety margin before the lease expires on the database,
// which is the time the cancellation has to reach the server. A migration whose COMMIT was
// already sent may still commit; a migration run without a transaction (goose's
// "-- +goose NO TRANSACTION") is cut off wherever its statement was; and a process paused
// past its TTL (GC, SIGSTOP) cancels nothing until it runs again, by which time another
// migrator may have taken the lease and started the same migration. Keep migrations
// transactional, and the TTL above the longest pause you expect (the heartbeat renews the
// lease meanwhile, so long migrations need no long TTL).
//
// Call the CancelFunc when done, as for [context.WithCancel]: it stops the goroutine that
// watches the locker, which otherwise lives until parent ends or a lease is lost. Safe for
// concurrent use; any number of contexts may watch one Locker.
func (g *Locker) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	go g.watch(ctx, cancel)
	return ctx, func() { cancel(context.Canceled) }
}

// watch cancels ctx with the lease's error when a lease held by g while ctx lives is lost, and
// returns when ctx ends.
func (g *Locker) watch(ctx context.Context, cancel context.CancelCauseFunc) {
	for {
		g.mu.Lock()
		lease, changed := g.held, g.changed
		g.mu.Unlock()
		var done <-chan struct{} // nil while nothing is held: wait for a Lock
		if lease != nil {
			done = lease.Done()
		}
		select {
		case <-ctx.Done():
			return
		case <-done:
		case <-changed:
		}
		if lease == nil {
			continue
		}
		// The lease has ended, or Unlock has taken it (the only change while one is held) and
		// is about to end it: Release ends a lease before any statement. Once ended, Err says
		// whether it was lost first, even when the loss raced the Unlock.
		select {
		case <-ctx.Done():
			return
		case <-lease.Done():
		}
		if err := lease.Err(); errors.Is(err, fencelock.ErrLeaseLost) {
			cancel(err)
			return
		}
	}
}
