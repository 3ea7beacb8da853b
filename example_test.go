package fencelock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/pgserver"
)

// The examples run against the test server of TestMain (see main_test.go), each on a fresh
// database with fencelock's schema, and their output is checked. With go test -short, which
// starts no server, they are skipped. In a program, the pool is yours: pgxpool.New(ctx,
// os.Getenv("DATABASE_URL")), then fencelock.Migrate(ctx, pool) once.

// A lease guards a payment capture; the fence in the same transaction rejects the write of a
// holder whose lease has moved on.
func Example() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
	defer stop()
	if err := fencelock.Migrate(ctx, pool); err != nil { // idempotent
		log.Fatal(err)
	}

	capture := func(lease *fencelock.Lease) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := lease.FenceTx(ctx, tx, "payment:42"); err != nil {
				return err
			}
			// ... the protected write, in tx: UPDATE payments SET status = 'captured' ...
			return nil
		})
	}

	w1, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-1"))
	w2, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-2"))
	old, err := w1.TryAcquire(ctx, "payment:42", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	// worker-1 stalls; its lease moves on (here: released; in life: expired) to worker-2.
	_ = old.Release(ctx)
	cur, err := w2.TryAcquire(ctx, "payment:42", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer cur.Release(ctx)
	fmt.Println("worker-2 captured:", capture(cur) == nil)

	// worker-1 wakes up and writes: the lease is no longer its own, so lease.FenceTx refuses.
	err = capture(old)
	fmt.Println("worker-1 refused:", err != nil)
	// A write that carries only its token, as one sent by a holder paused after its check, is
	// rejected by the fence, atomically: worker-2's token is larger.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return fencelock.FenceTx(ctx, tx, "payment:42", old.Token())
	})
	fmt.Println("worker-1's token rejected:", errors.Is(err, fencelock.ErrStaleToken))
	// Output:
	// worker-2 captured: true
	// worker-1 refused: true
	// worker-1's token rejected: true
}

// TryAcquire does not wait: ErrNotAcquired while another holder has the lease. Done closes,
// and Err says why, when the lease ends.
func ExampleLessor_TryAcquire() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
	defer stop()

	a, _ := fencelock.NewLessor(pool, fencelock.WithHolder("a"))
	b, _ := fencelock.NewLessor(pool, fencelock.WithHolder("b"))
	la, err := a.TryAcquire(ctx, "nightly-report", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	_, err = b.TryAcquire(ctx, "nightly-report", 30*time.Second)
	fmt.Println("b while a holds:", errors.Is(err, fencelock.ErrNotAcquired))

	if err := la.Release(ctx); err != nil {
		log.Fatal(err)
	}
	<-la.Done()
	fmt.Println("a after release:", la.Err())

	lb, err := b.TryAcquire(ctx, "nightly-report", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("b's token is larger:", lb.Token() > la.Token())
	_ = lb.Release(ctx)
	// Output:
	// b while a holds: true
	// a after release: fencelock: lease released
	// b's token is larger: true
}

// RunLocked holds the lease row FOR UPDATE for one transaction: no TTL, no heartbeat, and a
// fresh fencing token for the writes in it.
func ExampleLessor_RunLocked() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
	defer stop()

	l, _ := fencelock.NewLessor(pool)
	err := l.RunLocked(ctx, "inventory:sku-1", func(ctx context.Context, tx pgx.Tx, token fencelock.Token) error {
		// The lease row is held FOR UPDATE until this transaction ends; no TTL, no heartbeat.
		return fencelock.FenceTx(ctx, tx, "inventory:sku-1", token)
	})
	fmt.Println("ran locked:", err == nil)
	// Output:
	// ran locked: true
}

// The guarded write: Lease.GuardTx (or Lease.FenceTx) in the caller's transaction, then the
// protected write, which commits only if the grant is still current. What the caller does
// with the two errors: a *fencelock.LeaseLostError means the lease is no longer its own (stop
// all work under it); a *fencelock.StaleTokenError means the lease is current but a larger
// token has written the resource (the write is outdated: roll back, do not retry with this
// token).
func ExampleLease_GuardTx() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
	defer stop()
	if _, err := pool.Exec(ctx, `CREATE TABLE jobs (id int PRIMARY KEY, state text NOT NULL);
INSERT INTO jobs VALUES (1, 'queued')`); err != nil {
		log.Fatal(err)
	}

	// setState sets job 1's state in one transaction, after check (GuardTx or FenceTx).
	setState := func(who, state string, check func(pgx.Tx) error) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := check(tx); err != nil {
				return err // rolls tx back
			}
			_, err := tx.Exec(ctx, `UPDATE jobs SET state = $1 WHERE id = 1`, state)
			return err
		})
		var lost *fencelock.LeaseLostError
		var stale *fencelock.StaleTokenError
		switch {
		case err == nil:
			fmt.Printf("%s: job 1 %s\n", who, state)
		case errors.As(err, &lost): // errors.Is(err, fencelock.ErrLeaseLost)
			fmt.Printf("%s: lease %s lost (%v): stop working under it\n", who, lost.Name, lost.Cause)
		case errors.As(err, &stale): // errors.Is(err, fencelock.ErrStaleToken)
			fmt.Printf("%s: stale token for %s: a newer writer won, drop this write\n", who, stale.Resource)
		default:
			log.Fatal(err)
		}
	}

	// worker-1 renews nothing (as a paused process would): its lease has a short TTL.
	w1, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-1"), fencelock.WithoutHeartbeat())
	w2, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-2"))
	l1, err := w1.TryAcquire(ctx, "job:1", time.Second)
	if err != nil {
		log.Fatal(err)
	}
	setState("worker-1", "running", func(tx pgx.Tx) error { return l1.GuardTx(ctx, tx) })

	// worker-2 waits until worker-1's lease has expired on the database, and takes it over.
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	l2, err := w2.Acquire(actx, "job:1", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer l2.Release(ctx)
	setState("worker-1", "done", func(tx pgx.Tx) error { return l1.GuardTx(ctx, tx) })
	setState("worker-2", "done", func(tx pgx.Tx) error { return l2.FenceTx(ctx, tx, "job:1") })

	// A resource's fence sees the tokens of every lease that writes it: here an operator's
	// lease on all jobs, granted after worker-2's, writes job 1 first.
	ops, _ := fencelock.NewLessor(pool, fencelock.WithHolder("ops"))
	all, err := ops.TryAcquire(ctx, "jobs:all", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer all.Release(ctx)
	setState("ops", "cancelled", func(tx pgx.Tx) error { return all.FenceTx(ctx, tx, "job:1") })
	setState("worker-2", "archived", func(tx pgx.Tx) error { return l2.FenceTx(ctx, tx, "job:1") })

	var state string
	if err := pool.QueryRow(ctx, `SELECT state FROM jobs WHERE id = 1`).Scan(&state); err != nil {
		log.Fatal(err)
	}
	fmt.Println("job 1 is", state)
	// Output:
	// worker-1: job 1 running
	// worker-1: lease job:1 lost (fencelock: trust window expired): stop working under it
	// worker-2: job 1 done
	// ops: job 1 cancelled
	// worker-2: stale token for job:1: a newer writer won, drop this write
	// job 1 is cancelled
}

// FenceTx checks the lease and advances the resource's high-water mark to its token, in the
// caller's transaction. A *fencelock.LeaseLostError: the lease is gone, stop working under it.
// A *fencelock.StaleTokenError: the lease is current, but a larger token (of another lease
// that writes the same resource) has written it; this write is outdated, do not retry it.
func ExampleLease_FenceTx() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
	defer stop()
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (id int PRIMARY KEY, status text NOT NULL);
INSERT INTO payments VALUES (42, 'pending')`); err != nil {
		log.Fatal(err)
	}

	lessor, err := fencelock.NewLessor(pool)
	if err != nil {
		log.Fatal(err)
	}
	lease, err := lessor.Acquire(ctx, "payment:42", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := lease.FenceTx(ctx, tx, "payment:42"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE payments SET status = 'captured' WHERE id = 42`)
		return err
	})
	var lost *fencelock.LeaseLostError
	var stale *fencelock.StaleTokenError
	switch {
	case errors.As(err, &lost):
		log.Printf("lease %s lost (%v): stopping", lost.Name, lost.Cause)
	case errors.As(err, &stale):
		log.Printf("%s has seen token %d, ours is %d: dropping this write", stale.Resource, stale.Current, stale.Token)
	case err != nil:
		log.Fatal(err)
	}
	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM payments WHERE id = 42`).Scan(&status); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payment 42:", status)
	// Output:
	// payment 42: captured
}

// A worker stops its work when its lease's Done closes, and Err says why: ErrReleased after
// Release, a *fencelock.LeaseLostError (matching ErrLeaseLost) when the lease was lost.
func ExampleLease_Done() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
	defer stop()

	// work runs units of work under lease until its Done closes, and returns the cause.
	work := func(lease *fencelock.Lease) error {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-lease.Done():
				return lease.Err()
			case <-tick.C:
				// ... one unit of work, its writes fenced with lease.FenceTx ...
			}
		}
	}
	// start runs work in a goroutine; the func it returns waits for the worker to stop, and
	// fails the example if it does not within 5s.
	start := func(lease *fencelock.Lease) (wait func() error) {
		stopped := make(chan error, 1)
		go func() { stopped <- work(lease) }()
		return func() error {
			select {
			case err := <-stopped:
				return err
			case <-time.After(5 * time.Second):
				log.Fatalf("lease %s: Done did not close", lease.Name())
				return nil
			}
		}
	}

	// Released by its holder.
	w1, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-1"))
	lease, err := w1.TryAcquire(ctx, "report:daily", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	wait := start(lease)
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	err = wait()
	fmt.Println("worker-1 stopped, released:", errors.Is(err, fencelock.ErrReleased))

	// Lost and taken over. Nothing renews worker-2's lease (as in a paused process): its trust
	// window ends (TTL - safety margin after the grant was sent) before the lease expires on
	// the database, where worker-3 waits to take it over.
	w2, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-2"), fencelock.WithoutHeartbeat())
	w3, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-3"))
	paused, err := w2.TryAcquire(ctx, "report:daily", time.Second)
	if err != nil {
		log.Fatal(err)
	}
	wait = start(paused)
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	taken, err := w3.Acquire(actx, "report:daily", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer taken.Release(ctx)
	err = wait()
	var lost *fencelock.LeaseLostError
	fmt.Println("worker-2 stopped, lost:", errors.As(err, &lost), errors.Is(err, fencelock.ErrLeaseLost))
	fmt.Println("cause:", lost.Cause)
	fmt.Println("worker-3's token is larger:", taken.Token() > paused.Token())
	fmt.Println("worker-2's Release:", errors.Is(paused.Release(ctx), fencelock.ErrNotHeld))
	// Output:
	// worker-1 stopped, released: true
	// worker-2 stopped, lost: true true
	// cause: fencelock: trust window expired
	// worker-3's token is larger: true
	// worker-2's Release: true
}
