package integration

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
)

// BenchmarkFloorAdvisory is issue 23's floor table of the advisory pair: a session lock taken
// and released by fencelock (AdvisoryLocker.TryLock, then AdvisoryLock.Unlock) beside the same
// pair written by hand with pgx (acquire a pool connection, SELECT pg_try_advisory_lock($1),
// SELECT pg_advisory_unlock($1), release the connection) and a SELECT 1 round trip. Each
// client locks a key of its own, of the shape fencelock uses (the int64 key its name maps to),
// so no call is refused. A fourth row, raw+label, is the raw pair that also names the lock in
// application_name and puts the previous name back, as fencelock does (each in the lock's and
// the unlock's one statement): fencelock/raw+label is fencelock's cost over the same work done
// by hand, raw+label/raw the label's. Every row shares one pool of clients+1 connections (the locker's
// default cap on session locks is then the client count) and one locker, as a service would.
// Target: fencelock/raw >= 0.95 in every round (fencelock/raw-min), at 1 and 16 clients.
func BenchmarkFloorAdvisory(b *testing.B) {
	withFsync(b, func(b *testing.B, e *benchEnv) {
		withClients(b, func(b *testing.B, clients int) {
			pool := e.poolOf(b, int32(clients)+1)
			a, err := fencelock.NewAdvisoryLocker(pool)
			if err != nil {
				b.Fatal(err)
			}
			rows := floorTable(b, clients, []floorOp{
				{"raw", func(c int) (func() error, error) {
					key, err := a.Key(benchAdvisoryName(c))
					if err != nil {
						return nil, err
					}
					k, _ := key.Int64()
					return func() error { return rawAdvisoryPair(e, pool, k) }, nil
				}},
				{"raw+label", func(c int) (func() error, error) {
					key, err := a.Key(benchAdvisoryName(c))
					if err != nil {
						return nil, err
					}
					k, _ := key.Int64()
					return func() error { return rawLabelledAdvisoryPair(e, pool, k, "fencelock "+benchAdvisoryName(c)) }, nil
				}},
				{"fencelock", func(c int) (func() error, error) {
					name := benchAdvisoryName(c)
					return func() error {
						lk, err := a.TryLock(e.ctx, name)
						if err != nil {
							return err
						}
						return lk.Unlock(e.ctx)
					}, nil
				}},
				{"select1", func(int) (func() error, error) {
					return func() error {
						var one int
						return pool.QueryRow(e.ctx, `SELECT 1`).Scan(&one)
					}, nil
				}},
			})
			report(b, rows, [2]string{"fencelock", "raw"}, [2]string{"fencelock", "raw+label"},
				[2]string{"raw+label", "raw"}, [2]string{"raw", "select1"})
		})
	})
}

// benchAdvisoryName is the lock name of client c in the advisory floor tables.
func benchAdvisoryName(c int) string { return fmt.Sprintf("bench-advisory-%d", c) }

// rawAdvisoryPair is the advisory pair a user writes by hand with pgx: a pool connection,
// pg_try_advisory_lock, pg_advisory_unlock, the connection back. A refused lock or an unlock
// that released nothing is an error, as the benchmark's keys are its client's own.
func rawAdvisoryPair(e *benchEnv, pool *pgxpool.Pool, key int64) error {
	conn, err := pool.Acquire(e.ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var ok bool
	if err := conn.QueryRow(e.ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("raw: key %d is held", key)
	}
	if err := conn.QueryRow(e.ctx, `SELECT pg_advisory_unlock($1)`, key).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("raw: key %d was not held at unlock", key)
	}
	return nil
}

// rawLabelledAdvisoryPair is rawAdvisoryPair that also sets application_name to label while
// the lock is held, and puts the previous one back, in the same two statements.
func rawLabelledAdvisoryPair(e *benchEnv, pool *pgxpool.Pool, key int64, label string) error {
	conn, err := pool.Acquire(e.ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	prev := conn.Conn().PgConn().ParameterStatus("application_name")
	var ok bool
	if err := conn.QueryRow(e.ctx, `SELECT pg_try_advisory_lock($1) AND set_config('application_name', $2, false) IS NOT NULL`, key, label).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("raw+label: key %d is held", key)
	}
	if err := conn.QueryRow(e.ctx, `SELECT pg_advisory_unlock($1) AND set_config('application_name', $2, false) IS NOT NULL`, key, prev).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("raw+label: key %d was not held at unlock", key)
	}
	return nil
}
