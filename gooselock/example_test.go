package gooselock_test

import (
	"context"
	"log"
	"os"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/gooselock"
)

// This example is compiled with the package's tests but not run: it needs a PostgreSQL server
// (DATABASE_URL) where fencelock.Migrate has run. Its runnable version, with the output
// checked, is Example_gooseLocker in internal/integration/example_job_test.go.

// goose migrators that take turns through a lease, behind PgBouncer too; the run is cancelled
// if the lease is lost.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	lessor, err := fencelock.NewLessor(pool)
	if err != nil {
		log.Fatal(err)
	}
	locker, err := gooselock.New(lessor, "migrations:app", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	migrations := fstest.MapFS{
		"00001_accounts.sql": {Data: []byte("-- +goose Up\nCREATE TABLE accounts (id bigint PRIMARY KEY);\n")},
	}
	p, err := goose.NewProvider(goose.DialectPostgres, stdlib.OpenDBFromPool(pool), migrations, goose.WithLocker(locker))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := locker.Context(ctx) // before Up: goose hands it to Lock and every migration
	defer cancel()
	if _, err := p.Up(ctx); err != nil {
		log.Fatal(err) // wraps fencelock.ErrLeaseLost if the lease was lost mid-run
	}
}
