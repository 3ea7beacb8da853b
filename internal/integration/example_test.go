package integration

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/pgtest"
)

// exampleDB starts a throwaway Postgres (as the examples in README do when DATABASE_URL is
// unset) with a migrated database, and returns a pool on it and a func that stops it all.
func exampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	srv, err := pgtest.Start(ctx)
	if err != nil {
		log.Fatal(err)
	}
	_, url, err := srv.CreateDatabase(ctx)
	if err != nil {
		_ = srv.Close()
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		_ = srv.Close()
		log.Fatal(err)
	}
	return pool, func() { pool.Close(); _ = srv.Close() }
}

// A lease guards a payment capture; the fence in the same transaction rejects the write of a
// holder whose lease has moved on.
func Example_fencedCapture() {
	ctx := context.Background()
	pool, stop := exampleDB(ctx)
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

func Example_tryAcquire() {
	ctx := context.Background()
	pool, stop := exampleDB(ctx)
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

func Example_runLocked() {
	ctx := context.Background()
	pool, stop := exampleDB(ctx)
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
