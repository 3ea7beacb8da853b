package job_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/pgserver"
	"github.com/fencelock/fencelock/job"
)

// The examples run against the test server of TestMain (main_test.go), each on a fresh
// database with fencelock's schema, and their output is checked; with go test -short they are
// skipped. In a program, the pool is yours: pgxpool.New(ctx, os.Getenv("DATABASE_URL")), then
// fencelock.Migrate(ctx, pool) once.

// A report that every replica schedules hourly and one of them runs, once per hour, its write
// fenced by the run's lease. Here the run ends the schedule (cancel) once it has written.
func ExampleJob_Every() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
	defer stop()
	if _, err := pool.Exec(ctx, `CREATE TABLE reports (slot timestamptz PRIMARY KEY, attempt int NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	lessor, err := fencelock.NewLessor(pool, fencelock.WithHolder("replica-1"))
	if err != nil {
		log.Fatal(err)
	}
	j, err := job.New(lessor, "nightly-report", time.Minute) // the TTL bounds a crashed run
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	err = j.Every(ctx, time.Hour, func(ctx context.Context, run *job.Run) error {
		defer cancel() // this example stops after one run; a service runs until shutdown
		return pgx.BeginFunc(ctx, lessor.Pool(), func(tx pgx.Tx) error {
			if err := run.Lease.FenceTx(ctx, tx, "report"); err != nil {
				return err // the lease moved on: nothing written
			}
			_, err := tx.Exec(ctx, `INSERT INTO reports (slot, attempt) VALUES ($1, $2)`, run.Slot, run.Attempt)
			return err
		})
	}, func(slot time.Time, err error) { log.Printf("report of %v: %v", slot, err) })
	fmt.Println("Every returned ctx's error:", errors.Is(err, context.Canceled))
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM reports`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("reports written:", n)
	// Output:
	// Every returned ctx's error: true
	// reports written: 1
}

// One slot of a job on two replicas: the first runs it, under the job's lease, and the ledger
// says so; the second finds it done.
func ExampleJob_RunSlot() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
	defer stop()
	replica := func(id string) *job.Job {
		lessor, err := fencelock.NewLessor(pool, fencelock.WithHolder(id))
		if err != nil {
			log.Fatal(err)
		}
		j, err := job.New(lessor, "invoice-batch", 10*time.Second)
		if err != nil {
			log.Fatal(err)
		}
		return j
	}
	batch := time.Date(2026, 1, 31, 0, 0, 0, 0, time.UTC)
	run := func(ctx context.Context, run *job.Run) error {
		fmt.Println("running", run.Slot.UTC().Format(time.DateOnly), "attempt", run.Attempt, "held by", run.Lease.Holder())
		return nil
	}
	if err := replica("replica-1").RunSlot(ctx, batch, run); err != nil {
		log.Fatal(err)
	}
	err := replica("replica-2").RunSlot(ctx, batch, run)
	fmt.Println("replica-2:", errors.Is(err, job.ErrSlotDone))
	var outcome, holder string
	if err := pool.QueryRow(ctx, `SELECT outcome, holder FROM fencelock.job_ledger WHERE job = 'invoice-batch'`).Scan(&outcome, &holder); err != nil {
		log.Fatal(err)
	}
	fmt.Println("ledger:", outcome, "by", holder)
	// Output:
	// running 2026-01-31 attempt 1 held by replica-1
	// replica-2: true
	// ledger: succeeded by replica-1
}
