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
