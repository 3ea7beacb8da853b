// Package sqltx runs fencelock's generated statements on a database/sql transaction: it adapts
// a *sql.Tx to the pgx-shaped interface sqlc generates (db.DBTX), so the database/sql forms of
// the calls that take the caller's transaction send the very statements their pgx forms send,
// with the same arguments, and one copy of each statement serves both.
//
// Only what those statements need is adapted: Exec (with the rows affected) and QueryRow (with
// sql.ErrNoRows reported as pgx.ErrNoRows, which the callers test for). Query is not used on
// a caller's transaction and returns an error. Arguments are passed to database/sql as given:
// every statement fencelock runs there binds only strings, integers, booleans and times, which
// every Postgres driver for database/sql encodes (pgx's stdlib, lib/pq).
package sqltx

import (
	"context"
	"database/sql"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Conn is what a statement runs on: a *sql.Tx, or a *sql.Conn or *sql.DB.
type Conn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Tx adapts c to db.DBTX. The zero Tx is not usable.
type Tx struct{ c Conn }

// Wrap returns c as a db.DBTX.
func Wrap(c Conn) Tx { return Tx{c: c} }

// ErrQueryUnsupported is what Query returns: no statement fencelock runs on a caller's
// database/sql transaction reads more than one row.
var ErrQueryUnsupported = errors.New("sqltx: Query is not supported on a database/sql transaction")

// Exec runs sql and reports the rows it affected in a command tag ("SQL <n>", which
// pgconn.CommandTag.RowsAffected reads).
func (t Tx) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	res, err := t.c.ExecContext(ctx, query, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return pgconn.NewCommandTag("SQL " + strconv.FormatInt(n, 10)), nil
}

// Query returns ErrQueryUnsupported.
func (t Tx) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, ErrQueryUnsupported
}

// QueryRow runs sql; its row's Scan reports no row as pgx.ErrNoRows.
func (t Tx) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return row{t.c.QueryRowContext(ctx, query, args...)}
}

type row struct{ r *sql.Row }

func (r row) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return pgx.ErrNoRows
	}
	return err
}
