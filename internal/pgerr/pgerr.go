// Package pgerr holds the server states that more than one fencelock package reports, so that
// each reports them with the same sentinel without importing the others. Package fencelock and
// package ratelimit export [ErrReadOnly] under their own names, as the same value.
package pgerr

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrReadOnly is wrapped by the error of a statement that the server refused to run because it
// refuses writes: a hot standby, or default_transaction_read_only (SQLSTATE 25006).
var ErrReadOnly = errors.New("fencelock: server is read-only (hot standby?); locks must be taken on the primary")

// Wrap wraps err from a statement with what ("what: err"), and with [ErrReadOnly] too when
// the server refused the statement as a write on a read-only server (SQLSTATE 25006).
func Wrap(what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "25006" { // read_only_sql_transaction
		return fmt.Errorf("%s: %w: %w", what, ErrReadOnly, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
