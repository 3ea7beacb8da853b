package gooselock_test

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
	"github.com/fencelock/fencelock/internal/pgserver"
)

// The examples run against the test server of TestMain (main_test.go), each on a fresh
// database with fencelock's schema, and their output is checked; with go test -short they are
// skipped. In a program, the pool is yours: pgxpool.New(ctx, os.Getenv("DATABASE_URL")), then
// fencelock.Migrate(ctx, pool) once.

// goose migrations applied under a lease, which works behind PgBouncer too: the run is
// cancelled if the lease is lost, and the locker is free again once Up returns.
func ExampleNew() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
	defer stop()
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
		log.Fatal(err) // wraps fencelock.ErrLeaseLost if the lease was lost mid-run
	}
	fmt.Println("applied:", len(results))
	fmt.Println("released:", errors.Is(locker.Err(), fencelock.ErrReleased))
	// Output:
	// applied: 2
	// released: true
}
