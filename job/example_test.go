package job_test

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
	"github.com/fencelock/fencelock/job"
)

// These examples are compiled with the package's tests but not run: they need a PostgreSQL
// server (DATABASE_URL) where fencelock.Migrate has run. Their runnable version, with the
// output checked, is Example_job in internal/integration/example_job_test.go.

// exampleLessor returns a lessor on the server in DATABASE_URL.
func exampleLessor(ctx context.Context) *fencelock.Lessor {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	lessor, err := fencelock.NewLessor(pool)
	if err != nil {
		log.Fatal(err)
	}
	return lessor
}

// A report that every replica schedules hourly and one of them runs, once per hour, its write
// fenced by the run's lease.
func ExampleJob_Every() {
	ctx := context.Background()
	lessor := exampleLessor(ctx)
	j, err := job.New(lessor, "nightly-report", time.Minute) // the TTL bounds a crashed run
	if err != nil {
		log.Fatal(err)
	}
	err = j.Every(ctx, time.Hour, func(ctx context.Context, run *job.Run) error {
		return pgx.BeginFunc(ctx, lessor.Pool(), func(tx pgx.Tx) error {
			if err := run.Lease.FenceTx(ctx, tx, "report"); err != nil {
				return err // the lease moved on: nothing written
			}
			_, err := tx.Exec(ctx, `INSERT INTO reports (slot, attempt) VALUES ($1, $2)`, run.Slot, run.Attempt)
			return err
		})
	}, func(slot time.Time, err error) { log.Printf("report of %v: %v", slot, err) })
	fmt.Println(err) // ctx's error, once it ends
}

// One slot named by the caller: the first RunSlot of it runs, a second finds it done.
func ExampleJob_RunSlot() {
	ctx := context.Background()
	j, err := job.New(exampleLessor(ctx), "invoice-batch", 30*time.Second, job.WithRetryFailed())
	if err != nil {
		log.Fatal(err)
	}
	batch := time.Date(2026, 1, 31, 0, 0, 0, 0, time.UTC)
	run := func(ctx context.Context, run *job.Run) error {
		fmt.Println("running", run.Slot.Format(time.DateOnly), "attempt", run.Attempt)
		return nil
	}
	if err := j.RunSlot(ctx, batch, run); err != nil {
		log.Fatal(err)
	}
	err = j.RunSlot(ctx, batch, run)
	fmt.Println("again:", errors.Is(err, job.ErrSlotDone))
}
