package db

// Not generated: sqlc leaves this file alone.

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// QueueLeaseGrant queues [Queries.LeaseGrant] on b, for callers that send it in one batch
// with other statements. It takes the statement text and argument order from the generated
// method itself (run against a recorder), so the two cannot drift apart.
func (q *Queries) QueueLeaseGrant(b *pgx.Batch, arg LeaseGrantParams) {
	var r recorder
	_, _ = q.LeaseGrant(context.Background(), &r, arg)
	b.Queue(r.sql, r.args...)
}

// recorder is a DBTX that records the statement it is given instead of running it.
type recorder struct {
	sql  string
	args []any
}

var errRecorded = errors.New("db: statement recorded, not run")

func (r *recorder) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.sql, r.args = sql, args
	return pgconn.CommandTag{}, errRecorded
}

func (r *recorder) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.sql, r.args = sql, args
	return nil, errRecorded
}

func (r *recorder) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	r.sql, r.args = sql, args
	return errRow{}
}

type errRow struct{}

func (errRow) Scan(...any) error { return errRecorded }
