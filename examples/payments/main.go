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
	"fmt"
	"os"
	"os/signal"
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

	leaseTTL = 5 * time.Second // regular workers' leases, renewed by the heartbeat
	// pausedTTL, the paused workers' leases, is short, yet long enough that on a loaded
	// machine the grant's reply still leaves a paused worker time to check its lease before
	// it pauses: its trust window ends a tenth of the TTL before the lease, and with 300 ms,
	// replies under load left it 28 ms of the 270.
	pausedTTL  = 1 * time.Second
	pauseFor   = 1 * time.Second // as long as the TTL; the pause also lasts until the takeover
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
