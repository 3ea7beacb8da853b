// Command inventory shows a protected table refusing a stale write sent through an ORM, so
// that stock is never oversold by a paused lease holder.
//
// Several pods sell stock keeping units (SKUs), each sale under a lease named "sku:<sku>". The
// pods write through GORM (gorm.io/gorm with gorm.io/driver/postgres) on a *sql.DB that shares
// the lessor's pgxpool.Pool (pgx's stdlib.OpenDBFromPool), so one pool serves both. Each order
// is one GORM transaction (db.Transaction): lease.FenceSQLTx, on the transaction's *sql.Tx,
// checks that the lease is still the pod's and advances the SKU's high-water mark to the
// lease's token; fencelock.set_token hands the token to the table's trigger; the stock is
// decremented only if it is above 0, and a row is appended to orders. The pods sell until every
// SKU is sold out.
//
// The inventory table is protected: fencelock.protect_table('inventory') attached a trigger
// that refuses any write to a row whose token (set with fencelock.set_token in the same
// transaction, or a new value of the row's fence_token column) is older than the row's
// (SQLSTATE FL004, fencelock.ErrStaleToken after fencelock.WrapSQLError), or that carries none
// (FL006, fencelock.ErrNoToken). So every writer, the regular pods too, passes its token.
//
// A few pods "pause" (think stop-the-world GC, CPU throttling, SIGSTOP) right after they
// acquired a short lease and checked that the SKU was in stock. They run without heartbeat, as
// a paused process renews nothing. Their lease expires on the database clock, regular pods take
// the SKU over with larger tokens and sell it out. When the paused pod wakes up,
// lease.FenceSQLTx refuses: its lease is lost. It then writes anyway, through GORM, with its old
// token (SELECT fencelock.set_token(<token>) and an UPDATE that decrements the stock it checked
// before the pause), as a pod paused between its check and its write would, and the trigger
// refuses the stale token: the database stops the oversell, whatever client sent the write.
// The summary is counted from the database.
//
// Run it with an embedded PostgreSQL (local server binaries or Docker, through package pgtest):
//
//	go run ./examples/inventory
//
// or against a database of your own, where it drops and recreates its tables inventory, orders
// and inventory_stale_rejections:
//
//	DATABASE_URL=postgres://... go run ./examples/inventory
//
// The last line it prints is
//
//	inventory: orders=N oversold=O stale_writes_rejected=S
//
// N: rows in orders; O: SKUs whose stock went below 0 or that have more orders than their
// initial stock; S: rows in inventory_stale_rejections. It exits non-zero unless O is 0, S is greater
// than 0 and every unit of stock was sold exactly once (N is the initial stock of all SKUs).
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
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/examples/internal/demodb"
)

const (
	numPods = 4 // regular pods, with heartbeat

	leaseTTL   = 5 * time.Second // regular pods' leases, renewed by the heartbeat
	pausedTTL  = 1 * time.Second
	pauseFor   = 3500 * time.Millisecond // more than three TTLs
	runTimeout = 60 * time.Second
)

// stock is the initial stock of each SKU.
var stock = []struct {
	sku   string
	units int
}{
	{"MUG-BLK", 9},
	{"MUG-WHT", 7},
	{"TEE-S", 8},
	{"TEE-M", 12},
	{"TEE-L", 6},
	{"CAP-RED", 10},
	{"CAP-BLU", 11},
	{"BAG-TOTE", 5},
}

// pausedPods take one SKU each and pause while holding its lease.
var pausedPods = []struct {
	holder string
	sku    string
}{
	{"pod-5", "TEE-M"},
	{"pod-6", "CAP-BLU"},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	sum, err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "inventory:", err)
	}
	if sum != nil {
		fmt.Printf("inventory: orders=%d oversold=%d stale_writes_rejected=%d\n",
			sum.orders, sum.oversold, sum.staleRejected)
	}
	switch {
	case err != nil:
		os.Exit(1)
	case sum.oversold != 0:
		fmt.Fprintf(os.Stderr, "inventory: FAIL: %s oversold\n", plural(sum.oversold, "SKU"))
		os.Exit(1)
	case sum.staleRejected == 0:
		fmt.Fprintln(os.Stderr, "inventory: FAIL: no stale write was rejected; the demo did not show fencing")
		os.Exit(1)
	case sum.orders != sum.initialStock:
		fmt.Fprintf(os.Stderr, "inventory: FAIL: %s for %s of stock\n", plural(sum.orders, "order"), plural(sum.initialStock, "unit"))
		os.Exit(1)
	}
}

type summary struct {
	orders, oversold, staleRejected, initialStock int64
}

// run sets up the database, runs the pods and returns the summary read from the database.
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

	// One pool for both: the lessors use it directly, GORM through database/sql. Closing
	// sqlDB leaves the pool open.
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	// GORM's own logger would print the trigger's refusals and, on a loaded machine, slow
	// statements; the demo says what happens itself.
	gdb, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, fmt.Errorf("open gorm: %w", err)
	}

	if err := fencelock.Migrate(ctx, pool); err != nil {
		return nil, err
	}
	if err := setup(ctx, pool); err != nil {
		return nil, err
	}
	var units int
	for _, s := range stock {
		units += s.units
	}
	logf("%s (%s in stock); inventory protected by fencelock.protect_table; %s (TTL %v, heartbeat on) and %s that will pause for %v holding a %v lease without heartbeat",
		plural(len(stock), "SKU"), plural(units, "unit"), plural(numPods, "regular pod"), leaseTTL,
		plural(len(pausedPods), "pod"), pauseFor, pausedTTL)

	if err := sell(ctx, pool, gdb); err != nil {
		return nil, err
	}
	return summarize(ctx, pool)
}

// setup drops and creates the demo's tables, so reruns start clean, fills the inventory and
// protects it.
func setup(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `
DROP TABLE IF EXISTS inventory_stale_rejections, orders, inventory;
-- No CHECK (stock >= 0) on purpose, so an oversell would show here instead of failing.
-- fence_token is the column protect_table's trigger keeps: the newest fencing token that
-- wrote the row.
CREATE TABLE inventory (
    sku           text PRIMARY KEY,
    initial_stock int NOT NULL,
    stock         int NOT NULL,
    fence_token   bigint
);
-- Append-only: one row per order that committed.
CREATE TABLE orders (
    id    bigserial PRIMARY KEY,
    sku   text NOT NULL REFERENCES inventory,
    pod   text NOT NULL,
    token bigint NOT NULL,
    at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- One row per write that the inventory's trigger rejected as stale.
CREATE TABLE inventory_stale_rejections (
    sku           text NOT NULL REFERENCES inventory,
    pod           text NOT NULL,
    token         bigint NOT NULL,
    current_token bigint NOT NULL,
    at            timestamptz NOT NULL DEFAULT clock_timestamp()
);
`)
	if err != nil {
		return fmt.Errorf("create tables: %w", err)
	}
	skus := make([]string, len(stock))
	units := make([]int32, len(stock))
	for i, s := range stock {
		skus[i], units[i] = s.sku, int32(s.units)
	}
	// The stock arrives before the table is protected: these rows carry no token (a NULL
	// fence_token), and the first fenced write of each sets one.
	_, err = pool.Exec(ctx, `
INSERT INTO inventory (sku, initial_stock, stock)
SELECT sku, units, units FROM unnest($1::text[], $2::int[]) AS s (sku, units)`, skus, units)
	if err != nil {
		return fmt.Errorf("insert inventory: %w", err)
	}
	// From now on every INSERT, UPDATE and DELETE of a row of inventory must carry a fencing
	// token no older than the row's.
	if _, err := pool.Exec(ctx, `SELECT fencelock.protect_table('inventory')`); err != nil {
		return fmt.Errorf("protect inventory: %w", err)
	}
	return nil
}

// summarize counts, from the database and not from the pods' own counters, the orders, the
// oversold SKUs, the rejected stale writes and the initial stock.
func summarize(ctx context.Context, pool *pgxpool.Pool) (*summary, error) {
	var s summary
	err := pool.QueryRow(ctx, `
SELECT (SELECT count(*) FROM orders),
       (SELECT count(*) FROM inventory AS i
        WHERE i.stock < 0 OR (SELECT count(*) FROM orders AS o WHERE o.sku = i.sku) > i.initial_stock),
       (SELECT count(*) FROM inventory_stale_rejections),
       (SELECT coalesce(sum(initial_stock), 0) FROM inventory)`).Scan(&s.orders, &s.oversold, &s.staleRejected, &s.initialStock)
	if err != nil {
		return nil, fmt.Errorf("summarize: %w", err)
	}
	rows, err := pool.Query(ctx, `SELECT pod, count(*) FROM orders GROUP BY pod ORDER BY pod`)
	if err != nil {
		return nil, fmt.Errorf("summarize: %w", err)
	}
	type perPod struct {
		Pod string
		N   int64
	}
	byPod, err := pgx.CollectRows(rows, pgx.RowToStructByPos[perPod])
	if err != nil {
		return nil, fmt.Errorf("summarize: %w", err)
	}
	for _, p := range byPod {
		logf("%s sold %s", p.Pod, plural(p.N, "unit"))
	}
	return &s, nil
}

func leaseName(sku string) string { return "sku:" + sku }

// plural renders n and noun, adding an "s" unless n is 1: "1 order", "8 orders".
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
