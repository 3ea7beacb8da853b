package fencelock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
)

// These examples are compiled with the package's tests but not run: they need a PostgreSQL
// server (DATABASE_URL), which the fencelock module's own tests do not start. Their runnable
// versions, with the output checked, are in internal/integration/example_test.go.

// examplePool connects to the server in DATABASE_URL.
func examplePool(ctx context.Context) *pgxpool.Pool {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	return pool
}

// A lease guards a payment capture; the fence in the same transaction rejects the write of a
// holder whose lease has moved on.
func Example() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	if err := fencelock.Migrate(ctx, pool); err != nil { // idempotent
		log.Fatal(err)
	}

	lessor, err := fencelock.NewLessor(pool, fencelock.WithHolder("worker-1"))
	if err != nil {
		log.Fatal(err)
	}
	lease, err := lessor.Acquire(ctx, "payment:42", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The lease must still be ours, and no newer holder may have written: one statement.
		if err := lease.FenceTx(ctx, tx, "payment:42"); err != nil {
			return err // *fencelock.LeaseLostError or *fencelock.StaleTokenError: roll back
		}
		_, err := tx.Exec(ctx, `UPDATE payments SET status = 'captured' WHERE id = 42`)
		return err
	})
	switch {
	case errors.Is(err, fencelock.ErrLeaseLost), errors.Is(err, fencelock.ErrStaleToken):
		fmt.Println("not captured: the lease moved on")
	case err != nil:
		log.Fatal(err)
	}
}

// TryAcquire does not wait: ErrNotAcquired while another holder has the lease. Done closes,
// and Err says why, when the lease ends.
func ExampleLessor_TryAcquire() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	lessor, err := fencelock.NewLessor(pool)
	if err != nil {
		log.Fatal(err)
	}
	lease, err := lessor.TryAcquire(ctx, "nightly-report", 30*time.Second)
	if errors.Is(err, fencelock.ErrNotAcquired) {
		return // another replica runs it
	}
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	select {
	case <-lease.Done():
		log.Print("lease lost, stopping: ", lease.Err())
	case <-time.After(time.Second): // ... the work, stopping when Done closes
	}
}

// RunLocked holds the lease row FOR UPDATE for one transaction: no TTL, no heartbeat, and a
// fresh fencing token for the writes in it.
func ExampleLessor_RunLocked() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	lessor, err := fencelock.NewLessor(pool)
	if err != nil {
		log.Fatal(err)
	}
	err = lessor.RunLocked(ctx, "inventory:sku-1", func(ctx context.Context, tx pgx.Tx, token fencelock.Token) error {
		return fencelock.FenceTx(ctx, tx, "inventory:sku-1", token)
	})
	if err != nil {
		log.Fatal(err)
	}
}

// TryLock takes a session advisory lock without waiting: ErrNotAcquired while another session
// holds it. Lock waits for it instead. Done closes if the lock's session is lost.
func ExampleAdvisoryLocker_TryLock() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	locker, err := fencelock.NewAdvisoryLocker(pool)
	if err != nil {
		log.Fatal(err)
	}
	lk, err := locker.TryLock(ctx, "nightly-report") // locker.Lock(ctx, ...) waits instead
	if errors.Is(err, fencelock.ErrNotAcquired) {
		return // another replica runs it
	}
	if err != nil {
		log.Fatal(err)
	}
	defer lk.Unlock(ctx)
	select {
	case <-lk.Done():
		log.Print("session lost, stopping: ", lk.Err())
	case <-time.After(time.Second): // ... the work, stopping when Done closes
	}
}

// Lock options: Shared for a shared lock, AtKey for a key of your own (the name is then a label).
func ExampleAtKey() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	locker, err := fencelock.NewAdvisoryLocker(pool)
	if err != nil {
		log.Fatal(err)
	}
	lk, err := locker.Lock(ctx, "legacy-cron", fencelock.AtKey(fencelock.Int64Key(42)), fencelock.Shared)
	if err == nil {
		defer lk.Unlock(ctx) // held alongside other shared holders of pg_advisory_lock_shared(42)
	}
}

// TryLockTx takes a transaction advisory lock on the caller's transaction: no Unlock, the
// commit or rollback releases it. LockTx waits for it instead.
func ExampleAdvisoryLocker_TryLockTx() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	locker, err := fencelock.NewAdvisoryLocker(pool, fencelock.WithFencingTokens())
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		token, err := locker.TryLockTx(ctx, tx, "rebuild-index")
		if err != nil {
			return err // fencelock.ErrNotAcquired while another session or transaction holds it
		}
		// With WithFencingTokens, the grant's token fences the writes of this transaction.
		return fencelock.FenceTx(ctx, tx, "search-index", token)
	})
	switch {
	case errors.Is(err, fencelock.ErrNotAcquired):
		fmt.Println("another transaction rebuilds the index")
	case err != nil:
		log.Fatal(err)
	}
}

// GuardTx checks in the caller's transaction that the lease is still this grant, and holds
// its row until commit: the write after it commits before any takeover can. A
// *fencelock.LeaseLostError says the lease is no longer the caller's: stop working under it.
func ExampleLease_GuardTx() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	lessor, err := fencelock.NewLessor(pool)
	if err != nil {
		log.Fatal(err)
	}
	lease, err := lessor.Acquire(ctx, "job:1", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := lease.GuardTx(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE jobs SET state = 'done' WHERE id = 1`)
		return err
	})
	var lost *fencelock.LeaseLostError
	switch {
	case errors.As(err, &lost): // errors.Is(err, fencelock.ErrLeaseLost); lease.Done() has closed
		log.Printf("lease %s lost (%v): nothing written, stopping", lost.Name, lost.Cause)
	case err != nil:
		log.Fatal(err)
	}
}

// FenceTx checks the lease and advances the resource's high-water mark to its token, in the
// caller's transaction. A *fencelock.LeaseLostError: the lease is gone, stop working under it.
// A *fencelock.StaleTokenError: the lease is current, but a larger token (of another lease
// that writes the same resource) has written it; this write is outdated, do not retry it.
func ExampleLease_FenceTx() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

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
}

// UpdateFencedTx fences an update of the caller's own table, whose rows keep the token that
// last wrote them in a column: a write with a smaller token is rejected.
func ExampleUpdateFencedTx() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	lessor, err := fencelock.NewLessor(pool)
	if err != nil {
		log.Fatal(err)
	}
	lease, err := lessor.Acquire(ctx, "account:7", 10*time.Second) // or an advisory lock's token
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// UPDATE accounts SET balance_cents = 500, fence_token = <token>
		// WHERE id = 7 AND (fence_token IS NULL OR fence_token <= <token>)
		_, err := fencelock.UpdateFencedTx(ctx, tx, pgx.Identifier{"accounts"}, "fence_token", lease.Token(),
			[]fencelock.Column{{Name: "balance_cents", Value: 500}},
			[]fencelock.Column{{Name: "id", Value: 7}})
		return err
	})
	var stale *fencelock.StaleTokenError
	switch {
	case errors.As(err, &stale):
		log.Printf("row %s of %s carries token %d, newer than ours (%d): not written", stale.Key, stale.Table, stale.Current, stale.Token)
	case errors.Is(err, fencelock.ErrNoRow):
		log.Print("no account 7")
	case err != nil:
		log.Fatal(err)
	}
}

// A worker stops its work when the lease's Done closes, and Err says why: a
// *fencelock.LeaseLostError (matching fencelock.ErrLeaseLost) when renewals failed until the
// trust window ended or the lease was taken over; fencelock.ErrReleased after Release.
func ExampleLease_Done() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	lessor, err := fencelock.NewLessor(pool)
	if err != nil {
		log.Fatal(err)
	}
	lease, err := lessor.Acquire(ctx, "report:daily", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx) // then lease.Err() reports fencelock.ErrReleased

	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for range 50 { // 50 units of work, unless the lease ends first
		select {
		case <-lease.Done():
			log.Print("lease lost, stopping: ", lease.Err())
			return
		case <-tick.C:
			// ... one unit of work, its writes fenced with lease.FenceTx ...
		}
	}
}

// A semaphore caps a domain's workers at 4 across the fleet; each permit is a lease with its
// own fencing token. Acquire waits its turn in the semaphore's queue.
func ExampleSemaphore_Acquire() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	lessor, err := fencelock.NewLessor(pool)
	if err != nil {
		log.Fatal(err)
	}
	sem, err := fencelock.NewSemaphore(lessor, "domain:example.com", 4)
	if err != nil {
		log.Fatal(err)
	}
	permit, err := sem.Acquire(ctx, 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer permit.Release(ctx)
	work, cancel := permit.Context(ctx) // cancelled if the permit is lost
	defer cancel()
	_ = work // ... scrape under work ...
	st, err := sem.State(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %d of %d permits held, %d waiting\n", permit.Name(), st.Held, st.Limit, st.Waiting)
}

// Two accounts locked together, all or nothing, for a transfer: whatever order two transfers
// list them in, they never deadlock, and each member's token fences its own writes.
func ExampleLessor_AcquireAll() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	lessor, err := fencelock.NewLessor(pool)
	if err != nil {
		log.Fatal(err)
	}
	set, err := lessor.AcquireAll(ctx, []string{"account:7", "account:3"}, 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer set.Release(ctx)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, lease := range set.Leases() { // account:3, then account:7
			if err := lease.FenceTx(ctx, tx, lease.Name()); err != nil {
				return err
			}
		}
		// ... debit account 7, credit account 3, in tx ...
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("transferred under", len(set.Leases()), "leases")
}
