package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
)

// SetupRegister creates the fenced register's table, ledger(resource, entries), with one
// empty row per resource. entries is an append-only text[]: its final value is the commit
// order of the fenced appends.
func SetupRegister(ctx context.Context, pool *pgxpool.Pool, resources ...string) error {
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS ledger (resource text PRIMARY KEY, entries text[] NOT NULL DEFAULT '{}')`); err != nil {
		return fmt.Errorf("create ledger: %w", err)
	}
	_, err := pool.Exec(ctx, `INSERT INTO ledger (resource) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING`, resources)
	if err != nil {
		return fmt.Errorf("insert ledger rows: %w", err)
	}
	return nil
}

// Entry is the ledger entry of one append: "(worker,token,opid)".
func Entry(worker string, token fencelock.Token, opid string) string {
	return fmt.Sprintf("(%s,%d,%s)", worker, token, opid)
}

// Appender makes fenced appends to the ledger and records them.
type Appender struct {
	Pool   *pgxpool.Pool
	Rec    *Recorder
	Worker string
	Holder string
	// Guard, if not nil, runs first in the transaction (for example Lease.GuardTx).
	Guard func(ctx context.Context, tx pgx.Tx) error
	// BeforeWrite, if not nil, runs in the transaction between the fence and the write: a
	// place to inject a pause.
	BeforeWrite func()
	// AfterWrite, if not nil, runs in the transaction between the write and the commit: a
	// place to leave the transaction idle.
	AfterWrite func()

	seq int
}

// Append appends Entry(worker, token, opid) to the ledger of resource in one transaction
// that first calls FenceTx(resource, token), and records the operation. It returns the
// transaction's error.
func (a *Appender) Append(ctx context.Context, resource string, token fencelock.Token) error {
	a.seq++
	value := Entry(a.Worker, token, fmt.Sprintf("%s-%d", a.Worker, a.seq))
	id := a.Rec.Invoke(Op{Worker: a.Worker, Kind: KindAppend, Name: resource, Token: int64(token), Holder: a.Holder, Value: value})
	var at time.Time
	err := pgx.BeginFunc(ctx, a.Pool, func(tx pgx.Tx) error {
		if a.Guard != nil {
			if err := a.Guard(ctx, tx); err != nil {
				return err
			}
		}
		if err := fencelock.FenceTx(ctx, tx, resource, token); err != nil {
			return err
		}
		if a.BeforeWrite != nil {
			a.BeforeWrite()
		}
		if err := tx.QueryRow(ctx, `UPDATE ledger SET entries = entries || $2::text WHERE resource = $1 RETURNING clock_timestamp()`, resource, value).Scan(&at); err != nil {
			return err
		}
		if a.AfterWrite != nil {
			a.AfterWrite()
		}
		return nil
	})
	a.Rec.Complete(id, Classify(err), err, func(op *Op) {
		op.ServerAt = at
		var stale *fencelock.StaleTokenError
		if errors.As(err, &stale) {
			op.Stale, op.Current = true, int64(stale.Current)
		}
	})
	return err
}

// ReadLedger reads the ledger of resource and records the read.
func ReadLedger(ctx context.Context, pool *pgxpool.Pool, rec *Recorder, worker, resource string) ([]string, error) {
	id := rec.Invoke(Op{Worker: worker, Kind: KindRead, Name: resource})
	var entries []string
	var at time.Time
	err := pool.QueryRow(ctx, `SELECT entries, clock_timestamp() FROM ledger WHERE resource = $1`, resource).Scan(&entries, &at)
	outcome := OK
	if err != nil {
		outcome = Fail // a read changes nothing: a failed one is simply left out
	}
	rec.Complete(id, outcome, err, func(op *Op) { op.Entries, op.ServerAt = entries, at })
	return entries, err
}

// FenceOf returns the high-water mark of resource in fencelock.fences (0 if none).
func FenceOf(ctx context.Context, pool *pgxpool.Pool, resource string) (int64, error) {
	var hw int64
	err := pool.QueryRow(ctx, `SELECT coalesce((SELECT token FROM fencelock.fences WHERE resource = $1), 0)`, resource).Scan(&hw)
	return hw, err
}
