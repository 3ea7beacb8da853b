package integration

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // database/sql driver "postgres"
	"github.com/stretchr/testify/require"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/fencelock/fencelock"
)

// item is the row the ORMs write, in a table of each test's own:
// items (id text PRIMARY KEY, qty bigint, fence_token bigint).
type item struct {
	bun.BaseModel `bun:"table:items" gorm:"-"`

	ID         string `bun:"id,pk" db:"id" gorm:"primaryKey"`
	Qty        int64  `bun:"qty" db:"qty"`
	FenceToken *int64 `bun:"fence_token" db:"fence_token"`
}

// createItems creates the items table in b's database.
func createItems(t *testing.T, b *bundle) {
	t.Helper()
	_, err := b.Pool.Exec(b.Ctx, `CREATE TABLE items (id text PRIMARY KEY, qty bigint NOT NULL, fence_token bigint)`)
	require.NoError(t, err)
}

// ormTx is a transaction of an ORM (or plain database/sql) as its own API has it.
type ormTx interface {
	// sqlTx returns the *sql.Tx under the ORM's transaction, for the fencelock ...SQLTx calls.
	sqlTx() (*sql.Tx, error)
	// insert inserts it through the ORM's API.
	insert(ctx context.Context, it item) error
	// setQty sets the qty of row id through the ORM's API.
	setQty(ctx context.Context, id string, qty int64) error
	// setToken runs SELECT fencelock.set_token(token) through the ORM's raw SQL.
	setToken(ctx context.Context, token fencelock.Token) error
}

// orms are the ORMs and query builders services use beside database/sql, each with its own
// transaction type: open returns a function that runs fn in such a transaction on b's database,
// committed when fn returns nil and rolled back otherwise, returning fn's error as the ORM does.
// GORM, bun and one GORM on the test's pgx pool go through pgx's stdlib driver; sqlx and plain
// database/sql through lib/pq.
var orms = []struct {
	desc string
	open func(t *testing.T, b *bundle) func(ctx context.Context, fn func(ormTx) error) error
}{
	{"GORM", func(t *testing.T, b *bundle) func(context.Context, func(ormTx) error) error {
		return gormInTx(openGORM(t, postgres.Open(b.DB.URL)))
	}},
	{"GORMSharedPool", func(t *testing.T, b *bundle) func(context.Context, func(ormTx) error) error {
		sqlDB := stdlib.OpenDBFromPool(b.Pool)
		t.Cleanup(func() { _ = sqlDB.Close() })
		return gormInTx(openGORM(t, postgres.New(postgres.Config{Conn: sqlDB})))
	}},
	{"Bun", func(t *testing.T, b *bundle) func(context.Context, func(ormTx) error) error {
		db := bun.NewDB(openSQLDB(t, "pgx", b.DB.URL), pgdialect.New())
		return func(ctx context.Context, fn func(ormTx) error) error {
			return db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error { return fn(bunTx{tx}) })
		}
	}},
	{"Sqlx", func(t *testing.T, b *bundle) func(context.Context, func(ormTx) error) error {
		db := sqlx.NewDb(openSQLDB(t, "postgres", b.DB.URL), "postgres")
		return func(ctx context.Context, fn func(ormTx) error) error {
			tx, err := db.BeginTxx(ctx, nil)
			return inTx(tx, err, func() error { return fn(sqlxTx{tx}) })
		}
	}},
	{"LibPQ", func(t *testing.T, b *bundle) func(context.Context, func(ormTx) error) error {
		db := openSQLDB(t, "postgres", b.DB.URL)
		return func(ctx context.Context, fn func(ormTx) error) error {
			tx, err := db.BeginTx(ctx, nil)
			return inTx(tx, err, func() error { return fn(plainTx{tx}) })
		}
	}},
}

// openGORM opens GORM on dialector, its logger silent (refused writes are expected here).
func openGORM(t *testing.T, dialector gorm.Dialector) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(dialector, &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	t.Cleanup(func() { _ = sqlDB.Close() })
	return db
}

// gormInTx runs fn in GORM's own transaction (db.Transaction).
func gormInTx(db *gorm.DB) func(context.Context, func(ormTx) error) error {
	return func(ctx context.Context, fn func(ormTx) error) error {
		return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return fn(gormTx{tx}) })
	}
}

type gormTx struct{ tx *gorm.DB }

func (g gormTx) sqlTx() (*sql.Tx, error) {
	tx, ok := g.tx.Statement.ConnPool.(*sql.Tx)
	if !ok {
		return nil, errors.New("GORM's transaction is not on a *sql.Tx")
	}
	return tx, nil
}

func (g gormTx) insert(ctx context.Context, it item) error {
	return g.tx.WithContext(ctx).Create(&it).Error
}

func (g gormTx) setQty(ctx context.Context, id string, qty int64) error {
	return g.tx.WithContext(ctx).Model(&item{}).Where("id = ?", id).Update("qty", qty).Error
}

func (g gormTx) setToken(ctx context.Context, token fencelock.Token) error {
	return g.tx.WithContext(ctx).Exec("SELECT fencelock.set_token(?)", int64(token)).Error
}

type bunTx struct{ tx bun.Tx }

func (b bunTx) sqlTx() (*sql.Tx, error) { return b.tx.Tx, nil }

func (b bunTx) insert(ctx context.Context, it item) error {
	_, err := b.tx.NewInsert().Model(&it).Exec(ctx)
	return err
}

func (b bunTx) setQty(ctx context.Context, id string, qty int64) error {
	_, err := b.tx.NewUpdate().Model((*item)(nil)).Set("qty = ?", qty).Where("id = ?", id).Exec(ctx)
	return err
}

func (b bunTx) setToken(ctx context.Context, token fencelock.Token) error {
	_, err := b.tx.ExecContext(ctx, "SELECT fencelock.set_token(?)", int64(token))
	return err
}

type sqlxTx struct{ tx *sqlx.Tx }

func (s sqlxTx) sqlTx() (*sql.Tx, error) { return s.tx.Tx, nil }

func (s sqlxTx) insert(ctx context.Context, it item) error {
	_, err := s.tx.NamedExecContext(ctx, `INSERT INTO items (id, qty, fence_token) VALUES (:id, :qty, :fence_token)`, it)
	return err
}

func (s sqlxTx) setQty(ctx context.Context, id string, qty int64) error {
	_, err := s.tx.ExecContext(ctx, s.tx.Rebind(`UPDATE items SET qty = ? WHERE id = ?`), qty, id)
	return err
}

func (s sqlxTx) setToken(ctx context.Context, token fencelock.Token) error {
	_, err := s.tx.ExecContext(ctx, s.tx.Rebind(`SELECT fencelock.set_token(?)`), int64(token))
	return err
}

type plainTx struct{ tx *sql.Tx }

func (p plainTx) sqlTx() (*sql.Tx, error) { return p.tx, nil }

func (p plainTx) insert(ctx context.Context, it item) error {
	_, err := p.tx.ExecContext(ctx, `INSERT INTO items (id, qty, fence_token) VALUES ($1, $2, $3)`, it.ID, it.Qty, it.FenceToken)
	return err
}

func (p plainTx) setQty(ctx context.Context, id string, qty int64) error {
	_, err := p.tx.ExecContext(ctx, `UPDATE items SET qty = $1 WHERE id = $2`, qty, id)
	return err
}

func (p plainTx) setToken(ctx context.Context, token fencelock.Token) error {
	_, err := p.tx.ExecContext(ctx, `SELECT fencelock.set_token($1)`, int64(token))
	return err
}

// ormInTx runs fn in an ORM's own transaction, as orms' open returns it.
type ormInTx = func(ctx context.Context, fn func(ormTx) error) error

// forEachORM runs body, in parallel, in a subtest of each of orms, with a bundle of its own
// whose items table is created and the ORM's transaction runner opened on it.
func forEachORM(t *testing.T, body func(t *testing.T, b *bundle, inTx ormInTx)) {
	t.Helper()
	for _, o := range orms {
		t.Run(o.desc, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			createItems(t, b)
			body(t, b, o.open(t, b))
		})
	}
}

// fencedInsert, in one transaction of inTx, inserts it through the ORM, then runs fence on the
// *sql.Tx under the ORM's transaction: the write comes first, so a refused fence has a write
// to roll back.
func fencedInsert(ctx context.Context, inTx ormInTx, it item, fence func(*sql.Tx) error) error {
	return inTx(ctx, func(tx ormTx) error {
		if err := tx.insert(ctx, it); err != nil {
			return err
		}
		sqlTx, err := tx.sqlTx()
		if err != nil {
			return err
		}
		return fence(sqlTx)
	})
}

// readItems returns the ids of the rows of items, in order.
func readItems(t *testing.T, b *bundle) []string {
	t.Helper()
	ids := []string{}
	rows, err := b.Pool.Query(b.Ctx, `SELECT id FROM items ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	return ids
}

// Inside each ORM's own transaction, the current holder's fenced writes commit: with
// Lease.FenceSQLTx, and with FenceSQLTx and the lease's token.
func TestORMCurrentFencedWriteCommits(t *testing.T) {
	t.Parallel()
	forEachORM(t, func(t *testing.T, b *bundle, inTx ormInTx) {
		lease, err := newLessor(t, b.Pool, "a").TryAcquire(b.Ctx, "job", time.Minute)
		require.NoError(t, err)

		require.NoError(t, fencedInsert(b.Ctx, inTx, item{ID: "lease", Qty: 1}, func(sqlTx *sql.Tx) error {
			return lease.FenceSQLTx(b.Ctx, sqlTx, "job")
		}))
		require.NoError(t, fencedInsert(b.Ctx, inTx, item{ID: "token", Qty: 2}, func(sqlTx *sql.Tx) error {
			return fencelock.FenceSQLTx(b.Ctx, sqlTx, "job", lease.Token())
		}))
		require.Equal(t, []string{"lease", "token"}, readItems(t, b))
		var mark int64
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT token FROM fencelock.fences WHERE resource = 'job'`).Scan(&mark))
		require.Equal(t, int64(lease.Token()), mark)
	})
}

// Inside each ORM's own transaction, a write fenced with a token older than the resource's
// high-water mark is refused with a *StaleTokenError, which the ORM returns as is, and the
// ORM rolls the write back; so is a write fenced with a lease the database no longer has.
func TestORMStaleFencedWriteRolledBack(t *testing.T) {
	t.Parallel()
	forEachORM(t, func(t *testing.T, b *bundle, inTx ormInTx) {
		old, err := newLessor(t, b.Pool, "old").TryAcquire(b.Ctx, "job", time.Minute)
		require.NoError(t, err)
		_, err = b.Pool.Exec(b.Ctx, `SELECT fencelock.force_release('job', ARRAY[]::text[])`)
		require.NoError(t, err)
		cur, err := newLessor(t, b.Pool, "cur").TryAcquire(b.Ctx, "job", time.Minute)
		require.NoError(t, err)
		require.NoError(t, fencedInsert(b.Ctx, inTx, item{ID: "cur", Qty: 1}, func(sqlTx *sql.Tx) error {
			return cur.FenceSQLTx(b.Ctx, sqlTx, "job")
		}))

		err = fencedInsert(b.Ctx, inTx, item{ID: "stale", Qty: 2}, func(sqlTx *sql.Tx) error {
			return fencelock.FenceSQLTx(b.Ctx, sqlTx, "job", old.Token())
		})
		require.Equal(t, &fencelock.StaleTokenError{Resource: "job", Token: old.Token(), Current: cur.Token()}, errorsAsStale(t, err))

		err = fencedInsert(b.Ctx, inTx, item{ID: "lost", Qty: 3}, func(sqlTx *sql.Tx) error {
			return old.FenceSQLTx(b.Ctx, sqlTx, "job")
		})
		var lost *fencelock.LeaseLostError
		require.ErrorAs(t, err, &lost)
		require.Equal(t, old.Token(), lost.Token)

		require.Equal(t, []string{"cur"}, readItems(t, b), "a refused write was not rolled back")
	})
}

// A table protected with fencelock.protect_table refuses, whichever ORM and driver sends it, a
// write whose token (fencelock.set_token) is older than the row's (FL004, ErrStaleToken under
// WrapSQLError) and a write with no token (FL006, ErrNoToken); the driver's error stays in the
// chain and the row is unchanged. A write with the row's token or a newer one passes.
func TestORMProtectedTableRefusesStaleWrite(t *testing.T) {
	t.Parallel()
	forEachORM(t, func(t *testing.T, b *bundle, inTx ormInTx) {
		_, err := b.Pool.Exec(b.Ctx, `SELECT fencelock.protect_table('items')`)
		require.NoError(t, err)
		write := func(token fencelock.Token, qty int64) error {
			return inTx(b.Ctx, func(tx ormTx) error {
				if err := tx.setToken(b.Ctx, token); err != nil {
					return err
				}
				return tx.setQty(b.Ctx, "A-1", qty)
			})
		}
		requireRow := func(qty, token int64) {
			t.Helper()
			var got [2]int64
			require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT qty, fence_token FROM items WHERE id = 'A-1'`).Scan(&got[0], &got[1]))
			require.Equal(t, [2]int64{qty, token}, got, "qty and fence_token of the row")
		}
		require.NoError(t, inTx(b.Ctx, func(tx ormTx) error {
			if err := tx.setToken(b.Ctx, 7); err != nil {
				return err
			}
			return tx.insert(b.Ctx, item{ID: "A-1", Qty: 10})
		}))
		requireRow(10, 7)

		err = write(5, 9)
		require.ErrorIs(t, fencelock.WrapSQLError(err), fencelock.ErrStaleToken)
		var driverErr interface{ SQLState() string }
		require.ErrorAs(t, err, &driverErr)
		require.Equal(t, "FL004", driverErr.SQLState())
		requireRow(10, 7)

		err = inTx(b.Ctx, func(tx ormTx) error { return tx.setQty(b.Ctx, "A-1", 9) })
		require.ErrorIs(t, fencelock.WrapSQLError(err), fencelock.ErrNoToken)
		requireRow(10, 7)

		require.NoError(t, write(7, 8))
		requireRow(8, 7)
		require.NoError(t, write(8, 6))
		requireRow(6, 8)
	})
}

// With GORM on the lessor's own pool (stdlib.OpenDBFromPool), RunLockedSQL on GORM's *sql.DB
// runs GORM on the transaction that holds the lease row: GORM opened on the *sql.Tx writes in
// it, and fn's error rolls that write back.
func TestGORMSharedPoolRunLockedSQL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createItems(t, b)
	sqlDB := stdlib.OpenDBFromPool(b.Pool)
	t.Cleanup(func() { _ = sqlDB.Close() })
	db := openGORM(t, postgres.New(postgres.Config{Conn: sqlDB}))
	shared, err := db.DB()
	require.NoError(t, err)
	l := newLessor(t, b.Pool, "a")
	write := func(id string, result error) error {
		return l.RunLockedSQL(b.Ctx, shared, "job", func(ctx context.Context, tx *sql.Tx, token fencelock.Token) error {
			gtx, err := gorm.Open(postgres.New(postgres.Config{Conn: tx}), &gorm.Config{Logger: logger.Discard, SkipDefaultTransaction: true})
			if err != nil {
				return err
			}
			if err := fencelock.FenceSQLTx(ctx, tx, "job", token); err != nil {
				return err
			}
			if err := gtx.WithContext(ctx).Create(&item{ID: id, Qty: int64(token)}).Error; err != nil {
				return err
			}
			return result
		})
	}
	require.NoError(t, write("first", nil))
	errFn := errors.New("fn failed")
	require.Equal(t, errFn, write("rolled-back", errFn))
	require.NoError(t, write("second", nil))
	require.Equal(t, []string{"first", "second"}, readItems(t, b))
	var tokens [2]int64
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT (SELECT qty FROM items WHERE id = 'first'), (SELECT qty FROM items WHERE id = 'second')`).Scan(&tokens[0], &tokens[1]))
	require.Less(t, tokens[0], tokens[1], "the second grant's token is not larger")
}

// inTx runs fn in tx, begun with err, and commits it; tx is rolled back when fn fails.
func inTx(tx interface {
	Commit() error
	Rollback() error
}, err error, fn func() error) error {
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(); err != nil {
		return err
	}
	return tx.Commit()
}
