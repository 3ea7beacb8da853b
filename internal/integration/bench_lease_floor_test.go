package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"cirello.io/pglock"

	"github.com/fencelock/fencelock/internal/db"
)

// hwLeaseSchema is the hand-written lease a user would write instead of a library: one table,
// one sequence for fencing tokens, a grant that is one INSERT ... ON CONFLICT DO UPDATE taking
// an expired row, and a release that is one UPDATE scoped to the grant's token.
const hwLeaseSchema = `CREATE TABLE hw_leases (name text PRIMARY KEY, holder text NOT NULL, token bigint NOT NULL,
	expires_at timestamptz NOT NULL) WITH (fillfactor = 70);
CREATE SEQUENCE hw_token;`

const hwGrant = `INSERT INTO hw_leases AS l (name, holder, token, expires_at)
VALUES ($1, $2, nextval('hw_token'), now() + $3::bigint * interval '1 microsecond')
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, token = excluded.token, expires_at = excluded.expires_at
WHERE l.expires_at <= clock_timestamp()
RETURNING l.token`

// hwRelease ends the grant; with async, its commit does not wait for the WAL flush (a release
// lost in a crash only keeps the name held until its TTL), which is what fencelock's release does.
const hwRelease = `UPDATE hw_leases SET expires_at = clock_timestamp() WHERE name = $1 AND holder = $2 AND token = $3`
const hwReleaseAsync = `UPDATE hw_leases AS l SET expires_at = clock_timestamp()
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS cfg
WHERE l.name = $1 AND l.holder = $2 AND l.token = $3`

// BenchmarkFloorLease (issue 23): an uncontended lease grant and its release, each client on a
// name of its own, at 1 and 16 clients, fsync on and off. Rows:
//   - select1: a SELECT 1 round trip;
//   - hw-durable: the hand-written one-statement grant and release, both committed durably;
//   - hw: the same with the release committed asynchronously, the durability of fencelock's
//     (the token is durable when the grant returns; a release lost in a crash keeps the name
//     until its TTL);
//   - fencelock: Lessor.TryAcquire + Lease.Release (one Lessor shared by the clients, as in a
//     service), TTL one minute;
//   - statements: fencelock's two statements (LeaseGrant, LeaseRelease) sent on the same pool
//     without the lessor (issue 39: fencelock/statements is what the lessor's Go code costs a
//     pair; statements/hw what the statements' safety work costs);
//   - pglock: cirello.io/pglock v1.16.1 AcquireContext + ReleaseContext, its defaults.
//
// Targets: fencelock/hw >= 1.0 and fencelock/pglock >= 2.5, at 1 and 16 clients, fsync on;
// hw/pglock and hw-durable/pglock say how far ahead of pglock any one-statement lease gets.
func BenchmarkFloorLease(b *testing.B) {
	withFsync(b, func(b *testing.B, e *benchEnv) {
		if _, err := e.pool.Exec(e.ctx, hwLeaseSchema); err != nil {
			b.Fatal(err)
		}
		withClients(b, func(b *testing.B, clients int) {
			resetStatementStats(b, e)
			pool := e.poolOf(b, int32(clients)+4)
			l := benchLessor(b, pool)
			peer, err := pglock.New(e.sqlDBOf(b, clients+4))
			if err != nil {
				b.Fatal(err)
			}
			_ = peer.CreateTable() // one table per database; the second client count finds it
			ctx := context.Background()
			hw := func(release string) func(int) (func() error, error) {
				return func(c int) (func() error, error) {
					name, holder := fmt.Sprintf("hw-%d", c), fmt.Sprintf("holder-%d", c)
					return func() error {
						var token int64
						if err := pool.QueryRow(ctx, hwGrant, name, holder, time.Minute.Microseconds()).Scan(&token); err != nil {
							return err
						}
						ct, err := pool.Exec(ctx, release, name, holder, token)
						if err == nil && ct.RowsAffected() != 1 {
							err = fmt.Errorf("released %d rows", ct.RowsAffected())
						}
						return err
					}, nil
				}
			}
			rows := floorTable(b, clients, []floorOp{
				{"select1", func(int) (func() error, error) {
					return func() error {
						var one int
						return pool.QueryRow(ctx, `SELECT 1`).Scan(&one)
					}, nil
				}},
				{"hw-durable", hw(hwRelease)},
				{"hw", hw(hwReleaseAsync)},
				{"fencelock", leaseFloorOp(ctx, l, "fl")},
				{"statements", func(c int) (func() error, error) {
					// fencelock's own two statements, sent as the lessor sends them but without
					// it: what the lessor adds to a pair is fencelock minus this row.
					name, holder := fmt.Sprintf("st-%d", c), fmt.Sprintf("holder-%d", c)
					q := db.New()
					return func() error {
						g, err := q.LeaseGrant(ctx, pool, db.LeaseGrantParams{Name: name, Holder: holder, Nowait: true,
							TtlUs: time.Minute.Microseconds(), MayInsert: true})
						if err != nil {
							return err
						}
						released, err := q.LeaseRelease(ctx, pool, db.LeaseReleaseParams{Name: name, Holder: holder, Token: g.Token})
						if err == nil && released != 1 {
							err = fmt.Errorf("release outcome %d", released)
						}
						return err
					}, nil
				}},
				{"pglock", func(c int) (func() error, error) {
					name := fmt.Sprintf("pg-%d", c)
					return func() error {
						lk, err := peer.AcquireContext(ctx, name)
						if err != nil {
							return err
						}
						return peer.ReleaseContext(ctx, lk)
					}, nil
				}},
			})
			// hw/pglock: how far ahead of pglock a lease can be at all with one round trip per
			// grant and per release (the ceiling of fencelock/pglock on this machine).
			report(b, rows, [2]string{"fencelock", "statements"}, [2]string{"statements", "hw"}, [2]string{"fencelock", "hw"}, [2]string{"fencelock", "hw-durable"}, [2]string{"fencelock", "pglock"},
				[2]string{"hw", "pglock"}, [2]string{"hw-durable", "pglock"})
			serverTimes(b, e, map[string]string{
				"hw-grant":          "INSERT INTO hw_leases%",
				"hw-release":        "UPDATE hw_leases AS l%",
				"fencelock-grant":   lessorGrantStatement,
				"fencelock-release": lessorReleaseStatement,
			})
		})
	}, withStatementStats()...)
}
