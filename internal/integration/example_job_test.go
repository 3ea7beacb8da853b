package integration

import (
	"context"
	"errors"
	"fmt"
	"log"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/gooselock"
	"github.com/fencelock/fencelock/job"
)

// The runnable versions of the examples of packages job and gooselock (job/example_test.go,
// gooselock/example_test.go), with their output checked.

// One slot of a job on two replicas: the first runs it, under the job's lease, and the ledger
// says so; the second finds it done.
func Example_job() {
	ctx := context.Background()
	pool, stop := exampleDB(ctx)
	defer stop()
	if err := fencelock.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
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

// goose migrations applied under a lease: the locker is free again once Up returns.
func Example_gooseLocker() {
	ctx := context.Background()
	pool, stop := exampleDB(ctx)
	defer stop()
	if err := fencelock.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	lessor, err := fencelock.NewLessor(pool, fencelock.WithHolder("migrator-1"))
	if err != nil {
		log.Fatal(err)
	}
	locker, err := gooselock.New(lessor, "migrations:app", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	migrations := fstest.MapFS{
		"00001_accounts.sql": {Data: []byte("-- +goose Up\nCREATE TABLE accounts (id bigint PRIMARY KEY);\n")},
		"00002_orders.sql":   {Data: []byte("-- +goose Up\nCREATE TABLE orders (id bigint PRIMARY KEY);\n")},
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations,
		goose.WithLocker(locker), goose.WithDisableGlobalRegistry(true), goose.WithTableName("app_goose_version"))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := locker.Context(ctx) // before Up: goose hands it to Lock and every migration
	defer cancel()
	results, err := p.Up(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("applied:", len(results))
	fmt.Println("released:", errors.Is(locker.Err(), fencelock.ErrReleased))
	// Output:
	// applied: 2
	// released: true
}
