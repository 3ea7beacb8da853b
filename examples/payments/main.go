// Command payments shows fencing tokens stopping a paused lease holder from capturing a payment
// twice.
//
// Several workers capture pending payments, each under a lease named "payment:<id>". Each
// capture is one transaction: lease.FenceTx checks that the lease is still this worker's and
// advances the payment's high-water mark to the lease's token, in one statement; the payment
// is checked to still be pending, marked captured, and a row is appended to payment_captures.
//
// A few workers "pause" (think stop-the-world GC, CPU throttling, SIGSTOP) right after they
// acquired a short lease and checked that it was still valid. They run without heartbeat, as a
// paused process renews nothing. Their lease expires on the database clock, a regular worker
// takes the payment over with a larger token and captures it. When the paused worker wakes up,
// lease.FenceTx refuses: its lease is lost. It then writes anyway with its bare token, as a
// holder paused between its check and its write would, and fencelock.FenceTx rejects the
// stale token. The summary is counted from the database.
//
// The tokens in the output are not consecutive for one payment: one token sequence serves
// every lease name, so the tokens of a name increase but skip the values drawn meanwhile for
// other names (payment 4's lease may be granted token ...329, and ...430 at its takeover).
// They are large because their high 16 bits hold the epoch, the server's timeline (see
// fencelock.Token).
//
// Run it with an embedded PostgreSQL (local server binaries or Docker, through package pgtest):
//
//	go run ./examples/payments
//
// or against a database of your own, where it drops and recreates its tables payments,
// payment_captures and stale_rejections:
//
//	DATABASE_URL=postgres://... go run ./examples/payments
//
// The last line it prints is
//
//	payments: captured=N double_captures=D stale_writes_rejected=S
//
// and it exits non-zero unless every payment was captured, D is 0 and S is greater than 0.
package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/examples/internal/demodb"
)

const (
	numPayments = 20
	numWorkers  = 4 // regular workers, with heartbeat

	leaseTTL   = 5 * time.Second // regular workers' leases, renewed by the heartbeat
	pausedTTL  = 300 * time.Millisecond
	pauseFor   = 1 * time.Second // more than three TTLs
	runTimeout = 60 * time.Second
)

// pausedWorkers take one payment each and pause while holding its lease.
var pausedWorkers = []struct {
	holder  string
	payment int
}{
	{"worker-5", 4},
	{"worker-6", 11},
	{"worker-7", 17},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	sum, err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
	}
	if sum != nil {
		fmt.Printf("payments: captured=%d double_captures=%d stale_writes_rejected=%d\n",
			sum.captured, sum.doubleCaptures, sum.staleRejected)
	}
	switch {
	case err != nil:
		os.Exit(1)
	case sum.captured != numPayments:
		fmt.Fprintf(os.Stderr, "payments: FAIL: %d of %s captured\n", sum.captured, plural(numPayments, "payment"))
		os.Exit(1)
	case sum.doubleCaptures != 0:
		fmt.Fprintln(os.Stderr, "payments: FAIL: a payment was captured more than once")
		os.Exit(1)
	case sum.staleRejected == 0:
		fmt.Fprintln(os.Stderr, "payments: FAIL: no stale write was rejected; the demo did not show fencing")
		os.Exit(1)
	}
}

type summary struct {
	captured, doubleCaptures, staleRejected int64
}

// run sets up the database, runs the workers and returns the summary read from the database.
// Everything it starts (server, pool, goroutines) is stopped before it returns.
func run(ctx context.Context) (_ *summary, err error) {
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()

	url, stopDB, err := demodb.URL(ctx, func(s string) { logf("%s", s) })
	if err != nil {
		return nil, err
	}
	defer func() {
		if serr := stopDB(); serr != nil && err == nil {
			err = serr
		}
	}()

	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	cfg.MaxConns = max(cfg.MaxConns, 16)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()

	if err := fencelock.Migrate(ctx, pool); err != nil {
		return nil, err
	}
	if err := setup(ctx, pool); err != nil {
		return nil, err
	}
	logf("%s; %s (TTL %v, heartbeat on) and %s that will pause for %v holding a %v lease without heartbeat",
		plural(numPayments, "pending payment"), plural(numWorkers, "regular worker"), leaseTTL,
		plural(len(pausedWorkers), "worker"), pauseFor, pausedTTL)

	if err := capturePayments(ctx, pool); err != nil {
		return nil, err
	}
	return summarize(ctx, pool)
}

// setup drops and creates the demo's tables, so reruns start clean.
func setup(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `
DROP TABLE IF EXISTS stale_rejections, payment_captures, payments;
CREATE TABLE payments (
    id             int PRIMARY KEY,
    amount_cents   bigint NOT NULL,
    status         text NOT NULL DEFAULT 'pending',
    captured_by    text,
    captured_token bigint
);
-- Append-only: one row per capture that committed. No unique key on purpose, so a double
-- capture would show up here instead of failing.
CREATE TABLE payment_captures (
    payment_id int NOT NULL REFERENCES payments,
    worker     text NOT NULL,
    token      bigint NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- One row per fenced write that fencelock rejected as stale.
CREATE TABLE stale_rejections (
    payment_id    int NOT NULL REFERENCES payments,
    worker        text NOT NULL,
    token         bigint NOT NULL,
    current_token bigint NOT NULL,
    at            timestamptz NOT NULL DEFAULT clock_timestamp()
);
`)
	if err != nil {
		return fmt.Errorf("create tables: %w", err)
	}
	_, err = pool.Exec(ctx, `
INSERT INTO payments (id, amount_cents)
SELECT i, 1000 + 250 * i FROM generate_series(1, $1::int) AS i`, numPayments)
	if err != nil {
		return fmt.Errorf("insert payments: %w", err)
	}
	return nil
}

// events orders the paused workers against the regular ones with channels, not sleeps.
type events struct {
	paused chan struct{} // closed when every paused worker holds its lease

	mu       sync.Mutex
	captured map[int]chan struct{} // closed when the payment's capture has committed
}

func newEvents() *events {
	e := &events{paused: make(chan struct{}), captured: make(map[int]chan struct{})}
	for id := 1; id <= numPayments; id++ {
		e.captured[id] = make(chan struct{})
	}
	return e
}

func (e *events) markCaptured(id int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	select {
	case <-e.captured[id]:
	default:
		close(e.captured[id])
	}
}

func isPausedTarget(id int) bool {
	for _, p := range pausedWorkers {
		if p.payment == id {
			return true
		}
	}
	return false
}

// capturePayments runs the paused workers and the regular workers until every payment is
// captured, and returns the first unexpected error.
func capturePayments(ctx context.Context, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ev := newEvents()

	var wg sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
		cancel(err)
	}

	// The paused workers take their leases first; the regular workers start once they all
	// hold them, so the takeovers below always happen.
	var acquired sync.WaitGroup
	for _, p := range pausedWorkers {
		acquired.Add(1)
		wg.Go(func() {
			if err := pausedWorker(ctx, pool, ev, &acquired, p.holder, p.payment); err != nil {
				fail(fmt.Errorf("%s: %w", p.holder, err))
			}
		})
	}
	go func() {
		acquired.Wait()
		logf("note: all lease names share one token sequence, so a name's tokens increase but skip values; the high bits hold the epoch (server timeline)")
		close(ev.paused)
	}()

	for i := 1; i <= numWorkers; i++ {
		holder := fmt.Sprintf("worker-%d", i)
		wg.Go(func() {
			select {
			case <-ev.paused:
			case <-ctx.Done():
				return
			}
			if err := regularWorker(ctx, pool, ev, holder); err != nil {
				fail(fmt.Errorf("%s: %w", holder, err))
			}
		})
	}
	wg.Wait()
	return firstErr
}

// pausedWorker acquires the lease of payment id, checks it is valid, pauses past its TTL
// (without heartbeat, as a paused process renews nothing), then writes. By then a regular
// worker has taken the lease over with a larger token and captured the payment, so the fenced
// write must be rejected. The rejection is recorded in stale_rejections.
func pausedWorker(ctx context.Context, pool *pgxpool.Pool, ev *events, acquired *sync.WaitGroup, holder string, id int) (err error) {
	signalled := false
	defer func() {
		if !signalled {
			acquired.Done()
		}
	}()
	lessor, err := fencelock.NewLessor(pool, fencelock.WithHolder(holder), fencelock.WithoutHeartbeat())
	if err != nil {
		return err
	}
	name := leaseName(id)
	// Acquire, not TryAcquire: on a reused DATABASE_URL a lease of an interrupted earlier run
	// may still be live for a few seconds.
	actx, cancel := context.WithTimeout(ctx, 2*leaseTTL)
	lease, err := lessor.Acquire(actx, name, pausedTTL)
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		// The lease was lost during the pause, so Release finds nothing to end.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if rerr := lease.Release(rctx); rerr != nil && !errors.Is(rerr, fencelock.ErrNotHeld) && err == nil {
			err = rerr
		}
	}()
	select {
	case <-lease.Done():
		return fmt.Errorf("lease %s ended right after the grant: %w", name, lease.Err())
	default:
	}
	logf("%s: acquired %s (token %d, TTL %v, no heartbeat); lease.Done() is open, so it goes to capture, and pauses for %v on the way",
		holder, name, lease.Token(), pausedTTL, pauseFor)
	acquired.Done()
	signalled = true

	// The pause. The sleep is real and lasts more than three TTLs. So that the demo shows a
	// rejection on every run, the pause also lasts until the takeover has committed.
	select {
	case <-time.After(pauseFor):
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	select {
	case <-ev.captured[id]:
	case <-ctx.Done():
		return context.Cause(ctx)
	}

	logf("%s: wakes up and writes payment %d with lease.FenceTx", holder, id)
	_, err = capture(ctx, pool, func(ctx context.Context, tx pgx.Tx) error { return lease.FenceTx(ctx, tx, name) }, lease.Token(), holder, id)
	if !errors.Is(err, fencelock.ErrLeaseLost) {
		return fmt.Errorf("payment %d: lease.FenceTx after the pause: %v, want fencelock.ErrLeaseLost", id, err)
	}
	logf("%s: refused: %v", holder, err)
	// A holder paused between its check and its write gets no second look at its lease: its
	// statement carries only its token. The fence is what stops it.
	logf("%s: writes payment %d anyway with its bare token %d, as a holder paused after its check would", holder, id, lease.Token())
	captured, err := capture(ctx, pool, func(ctx context.Context, tx pgx.Tx) error { return fencelock.FenceTx(ctx, tx, name, lease.Token()) }, lease.Token(), holder, id)
	var stale *fencelock.StaleTokenError
	switch {
	case errors.As(err, &stale):
		logf("%s: REJECTED: %v", holder, err)
		if err := recordRejection(ctx, pool, id, holder, stale); err != nil {
			return err
		}
	case err != nil:
		return err
	case captured:
		return fmt.Errorf("payment %d: the write with token %d after the pause was accepted", id, lease.Token())
	default:
		return fmt.Errorf("payment %d: the write with token %d after the pause was not rejected as stale", id, lease.Token())
	}

	select {
	case <-lease.Done():
		logf("%s: and lease.Done() had closed meanwhile: %v", holder, lease.Err())
	default:
		return fmt.Errorf("lease %s: Done() still open %v after the grant, past its TTL of %v", name, pauseFor, pausedTTL)
	}
	if !errors.Is(lease.Err(), fencelock.ErrLeaseLost) {
		return fmt.Errorf("lease %s: Err() = %v, want fencelock.ErrLeaseLost", name, lease.Err())
	}
	return nil
}

// regularWorker captures pending payments until none is left. It tries each pending payment
// with TryAcquire; when every one it tried was held by someone else, it waits for one with
// Acquire, which returns as soon as the holder releases it or its lease expires.
func regularWorker(ctx context.Context, pool *pgxpool.Pool, ev *events, holder string) error {
	lessor, err := fencelock.NewLessor(pool, fencelock.WithHolder(holder))
	if err != nil {
		return err
	}
	for {
		ids, err := pendingPayments(ctx, pool)
		if err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		got := false
		for _, id := range ids {
			lease, err := lessor.TryAcquire(ctx, leaseName(id), leaseTTL)
			if errors.Is(err, fencelock.ErrNotAcquired) {
				continue
			}
			if err != nil {
				return err
			}
			got = true
			if err := captureAndRelease(ctx, pool, ev, lease, holder, id); err != nil {
				return err
			}
		}
		if got {
			continue
		}
		id := ids[0]
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		lease, err := lessor.Acquire(actx, leaseName(id), leaseTTL)
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				continue // still held; look again
			}
			return err
		}
		if err := captureAndRelease(ctx, pool, ev, lease, holder, id); err != nil {
			return err
		}
	}
}

func captureAndRelease(ctx context.Context, pool *pgxpool.Pool, ev *events, lease *fencelock.Lease, holder string, id int) error {
	captured, err := capture(ctx, pool, func(ctx context.Context, tx pgx.Tx) error { return lease.FenceTx(ctx, tx, lease.Name()) }, lease.Token(), holder, id)
	// Release even when ctx has ended, so an interrupted run leaves no lease held.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if rerr := lease.Release(rctx); rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	if captured {
		if isPausedTarget(id) {
			logf("%s: took %s over with token %d after the paused holder's lease expired, and captured it", holder, lease.Name(), lease.Token())
		}
		ev.markCaptured(id)
	}
	return nil
}

// errNotPending rolls back a capture whose payment was captured by someone else already.
var errNotPending = errors.New("payment is not pending")

// capture captures payment id in one transaction: fence, check, update, append. fence is
// lease.FenceTx for a lease holder (the pattern to copy). It reports whether it captured the
// payment (false: it was no longer pending). A lost lease comes back as a
// *fencelock.LeaseLostError, a stale token as a *fencelock.StaleTokenError, with the
// transaction rolled back.
func capture(ctx context.Context, pool *pgxpool.Pool, fence func(context.Context, pgx.Tx) error, token fencelock.Token, holder string, id int) (bool, error) {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The fence: checks the lease is still ours and advances fencelock.fences("payment:<id>")
		// to our token, or fails. Its rows stay locked until commit, so fenced writers of one
		// payment run one after the other and the check below sees the previous capture.
		if err := fence(ctx, tx); err != nil {
			return err
		}
		var status string
		if err := tx.QueryRow(ctx, `SELECT status FROM payments WHERE id = $1`, id).Scan(&status); err != nil {
			return fmt.Errorf("read payment %d: %w", id, err)
		}
		if status != "pending" {
			return errNotPending
		}
		if _, err := tx.Exec(ctx,
			`UPDATE payments SET status = 'captured', captured_by = $2, captured_token = $3 WHERE id = $1`,
			id, holder, int64(token)); err != nil {
			return fmt.Errorf("capture payment %d: %w", id, err)
		}
		if _, err := tx.Exec(ctx,
			`INSERT INTO payment_captures (payment_id, worker, token) VALUES ($1, $2, $3)`,
			id, holder, int64(token)); err != nil {
			return fmt.Errorf("record capture of payment %d: %w", id, err)
		}
		return nil
	})
	if errors.Is(err, errNotPending) {
		return false, nil
	}
	return err == nil, err
}

// recordRejection notes a rejected fenced write, in a transaction of its own (the rejected
// one was rolled back), so the summary counts rejections from the database.
func recordRejection(ctx context.Context, pool *pgxpool.Pool, id int, holder string, stale *fencelock.StaleTokenError) error {
	_, err := pool.Exec(ctx,
		`INSERT INTO stale_rejections (payment_id, worker, token, current_token) VALUES ($1, $2, $3, $4)`,
		id, holder, int64(stale.Token), int64(stale.Current))
	if err != nil {
		return fmt.Errorf("record stale rejection of payment %d: %w", id, err)
	}
	return nil
}

func pendingPayments(ctx context.Context, pool *pgxpool.Pool) ([]int, error) {
	rows, err := pool.Query(ctx, `SELECT id FROM payments WHERE status = 'pending' ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list pending payments: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("list pending payments: %w", err)
	}
	return ids, nil
}

// summarize counts, from the database and not from the workers' own counters, the captured
// payments, the payments captured more than once, and the rejected stale writes.
func summarize(ctx context.Context, pool *pgxpool.Pool) (*summary, error) {
	var s summary
	err := pool.QueryRow(ctx, `
SELECT (SELECT count(*) FROM payments WHERE status = 'captured'),
       (SELECT count(*) FROM (SELECT payment_id FROM payment_captures GROUP BY payment_id HAVING count(*) > 1) AS d),
       (SELECT count(*) FROM stale_rejections)`).Scan(&s.captured, &s.doubleCaptures, &s.staleRejected)
	if err != nil {
		return nil, fmt.Errorf("summarize: %w", err)
	}
	rows, err := pool.Query(ctx, `SELECT worker, count(*) FROM payment_captures GROUP BY worker ORDER BY worker`)
	if err != nil {
		return nil, fmt.Errorf("summarize: %w", err)
	}
	type perWorker struct {
		Worker string
		N      int64
	}
	byWorker, err := pgx.CollectRows(rows, pgx.RowToStructByPos[perWorker])
	if err != nil {
		return nil, fmt.Errorf("summarize: %w", err)
	}
	for _, w := range byWorker {
		logf("%s captured %s", w.Worker, plural(w.N, "payment"))
	}
	return &s, nil
}

func leaseName(id int) string { return fmt.Sprintf("payment:%d", id) }

// plural renders n and noun, adding an "s" unless n is 1: "1 payment", "8 payments".
func plural[N ~int | ~int64](n N, noun string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

var start = time.Now()

// logf prints a line prefixed with the time since start.
func logf(format string, args ...any) {
	fmt.Printf("[%6.3fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
}
