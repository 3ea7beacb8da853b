package integration

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencelock/fencelock"
)

// The cost of reaching fencelock from other stacks (issue 29), in floor tables (see
// bench_floor_test.go): fsync on and off, 1 and 16 clients, interleaved rounds.

// BenchmarkFloorFenceSQL: a fenced write, one transaction of BEGIN, the fence, a one-row
// UPDATE and COMMIT, each client on a resource of its own (per client count: the database is
// shared) and a row of its own, with a rising token.
// Rows:
//   - update: BEGIN, the one-row UPDATE, COMMIT through pgx (the floor: no fence);
//   - pgx: the fenced write with FenceTx on a pgx.Tx;
//   - sql-shared: the same with FenceSQLTx on a *sql.Tx of stdlib.OpenDBFromPool(pool);
//   - sql-pq: the same on a *sql.Tx of a lib/pq *sql.DB.
//
// Target: sql-shared/pgx and sql-pq/pgx >= 1/1.2 (a fence through database/sql within 1.2x
// of the same fence through pgx), fsync on.
func BenchmarkFloorFenceSQL(b *testing.B) {
	withFsync(b, func(b *testing.B, e *benchEnv) {
		withClients(b, func(b *testing.B, clients int) {
			resetStatementStats(b, e)
			pool := e.poolOf(b, int32(clients)+4)
			shared := stdlib.OpenDBFromPool(pool)
			b.Cleanup(func() { _ = shared.Close() })
			pq := e.sqlDBOf(b, clients+4)
			ctx := context.Background()
			viaSQL := func(sqlDB *sql.DB, prefix string) func(int) (func() error, error) {
				return func(c int) (func() error, error) {
					resource, token := fmt.Sprintf("%s-%d-%d", prefix, clients, c), fencelock.Token(0)
					return func() error {
						token++
						tx, err := sqlDB.BeginTx(ctx, nil)
						if err != nil {
							return err
						}
						defer func() { _ = tx.Rollback() }()
						if err := fencelock.FenceSQLTx(ctx, tx, resource, token); err != nil {
							return err
						}
						if _, err := tx.ExecContext(ctx, `UPDATE bench SET v = v + 1 WHERE id = $1`, c+1); err != nil {
							return err
						}
						return tx.Commit()
					}, nil
				}
			}
			rows := floorTable(b, clients, []floorOp{
				{"update", func(c int) (func() error, error) {
					return func() error {
						return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
							_, err := tx.Exec(ctx, `UPDATE bench SET v = v + 1 WHERE id = $1`, c+1)
							return err
						})
					}, nil
				}},
				{"pgx", func(c int) (func() error, error) {
					resource, token := fmt.Sprintf("pgx-%d-%d", clients, c), fencelock.Token(0)
					return func() error {
						token++
						return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
							if err := fencelock.FenceTx(ctx, tx, resource, token); err != nil {
								return err
							}
							_, err := tx.Exec(ctx, `UPDATE bench SET v = v + 1 WHERE id = $1`, c+1)
							return err
						})
					}, nil
				}},
				{"sql-shared", viaSQL(shared, "shared")},
				{"sql-pq", viaSQL(pq, "pq")},
			})
			report(b, rows, [2]string{"sql-shared", "pgx"}, [2]string{"sql-pq", "pgx"}, [2]string{"pgx", "update"})
		})
	}, withStatementStats()...)
}

// BenchmarkFloorStaleWriteTrigger: the server time a protected table's trigger
// (fencelock.protect_table) adds to a one-row UPDATE. Each client updates a row of its own,
// with a rising token. Rows:
//   - plain: UPDATE of a table without the trigger;
//   - column: UPDATE of a protected table that passes its token in the token column;
//   - setting: fencelock.set_token and the UPDATE of the protected table in one implicit
//     transaction (a pgx batch: one round trip).
//
// It reports each statement's mean server time (pg_stat_statements, "srv-*-us"), the figure
// the issue asks for, beside the throughputs.
func BenchmarkFloorStaleWriteTrigger(b *testing.B) {
	withFsync(b, func(b *testing.B, e *benchEnv) {
		if _, err := e.pool.Exec(e.ctx, `CREATE TABLE plain_stock (id int PRIMARY KEY, n bigint NOT NULL, fence_token bigint) WITH (fillfactor = 70);
			CREATE TABLE fenced_stock (id int PRIMARY KEY, n bigint NOT NULL, fence_token bigint) WITH (fillfactor = 70);
			CREATE TABLE fenced_stock2 (id int PRIMARY KEY, n bigint NOT NULL, fence_token bigint) WITH (fillfactor = 70);
			INSERT INTO plain_stock SELECT g, 0, NULL FROM generate_series(1, 64) g;
			INSERT INTO fenced_stock SELECT g, 0, NULL FROM generate_series(1, 64) g;
			INSERT INTO fenced_stock2 SELECT g, 0, NULL FROM generate_series(1, 64) g;
			SELECT fencelock.protect_table('fenced_stock');
			SELECT fencelock.protect_table('fenced_stock2')`); err != nil {
			b.Fatal(err)
		}
		var runs int64 // tokens rise across client counts (the rows keep the last): each starts higher
		withClients(b, func(b *testing.B, clients int) {
			resetStatementStats(b, e)
			pool := e.poolOf(b, int32(clients)+4)
			ctx := context.Background()
			runs++
			base := runs << 40
			rows := floorTable(b, clients, []floorOp{
				{"plain", func(c int) (func() error, error) {
					token := base
					return func() error {
						token++
						_, err := pool.Exec(ctx, `UPDATE plain_stock SET n = n + 1, fence_token = $2 WHERE id = $1`, c+1, token)
						return err
					}, nil
				}},
				{"column", func(c int) (func() error, error) {
					token := base
					return func() error {
						token++
						ct, err := pool.Exec(ctx, `UPDATE fenced_stock SET n = n + 1, fence_token = $2 WHERE id = $1`, c+1, token)
						if err == nil && ct.RowsAffected() != 1 {
							err = fmt.Errorf("updated %d rows", ct.RowsAffected())
						}
						return err
					}, nil
				}},
				{"setting", func(c int) (func() error, error) {
					token := base
					return func() error {
						token++
						batch := &pgx.Batch{}
						batch.Queue(`SELECT fencelock.set_token($1)`, token)
						batch.Queue(`UPDATE fenced_stock2 SET n = n + 1 WHERE id = $1`, c+1)
						return pool.SendBatch(ctx, batch).Close()
					}, nil
				}},
			})
			report(b, rows, [2]string{"column", "plain"}, [2]string{"setting", "plain"})
			serverTimes(b, e, map[string]string{
				"plain":          "UPDATE plain_stock%",
				"column":         "UPDATE fenced_stock SET%",
				"setting-update": "UPDATE fenced_stock2%",
				"set-token":      "SELECT fencelock.set_token%",
			})
		})
	}, withStatementStats()...)
}

// BenchmarkFloorSQLAPILease: a lease grant and its release through the SQL API against the Go
// lessor's pair, each client on a name of its own. Rows:
//   - go: Lessor.TryAcquire + Lease.Release (its release commits asynchronously);
//   - sql: SELECT fencelock.try_acquire(...), then SELECT fencelock.release(...), as a worker in
//     another language sends them (the release commits durably: it leaves synchronous_commit
//     alone, since it may share a transaction with a fenced write);
//   - sql-async: the same with the release's commit asynchronous, as the Go lessor's.
//
// It reports sql/go and sql-async/go, and each statement's server time: whether the Go lessor
// could call the SQL functions at no measurable cost.
func BenchmarkFloorSQLAPILease(b *testing.B) {
	withFsync(b, func(b *testing.B, e *benchEnv) {
		withClients(b, func(b *testing.B, clients int) {
			resetStatementStats(b, e)
			pool := e.poolOf(b, int32(clients)+4)
			l := benchLessor(b, pool)
			ctx := context.Background()
			viaSQL := func(release string) func(int) (func() error, error) {
				return func(c int) (func() error, error) {
					name, holder := fmt.Sprintf("sql-%d-%d", len(release), c), fmt.Sprintf("py-%d", c)
					return func() error {
						var token *int64
						if err := pool.QueryRow(ctx, `SELECT fencelock.try_acquire($1, $2, interval '1 minute')`, name, holder).Scan(&token); err != nil {
							return err
						}
						if token == nil {
							return fmt.Errorf("%s not acquired", name)
						}
						var released bool
						if err := pool.QueryRow(ctx, release, name, holder, *token).Scan(&released); err != nil {
							return err
						}
						if !released {
							return fmt.Errorf("%s not released", name)
						}
						return nil
					}, nil
				}
			}
			rows := floorTable(b, clients, []floorOp{
				{"go", leaseFloorOp(ctx, l, "go")},
				{"sql", viaSQL(`SELECT fencelock.release($1, $2, $3)`)},
				{"sql-async", viaSQL(`SELECT fencelock.release($1, $2, $3) FROM (SELECT set_config('synchronous_commit', 'off', true)) AS cfg`)},
			})
			report(b, rows, [2]string{"sql", "go"}, [2]string{"sql-async", "go"})
			serverTimes(b, e, map[string]string{
				"go-grant":    lessorGrantStatement,
				"go-release":  lessorReleaseStatement,
				"sql-grant":   "SELECT fencelock.try_acquire%",
				"sql-release": "SELECT fencelock.release%",
			})
		})
	}, withStatementStats()...)
}
