package pgerr

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// A read-only refusal (SQLSTATE 25006) matches ErrReadOnly and stays a *pgconn.PgError; any
// other error is wrapped alone.
func TestWrap(t *testing.T) {
	t.Parallel()
	ro := Wrap("rate limit \"k\"", &pgconn.PgError{Severity: "ERROR", Code: "25006", Message: "cannot execute UPDATE in a read-only transaction"})
	require.ErrorIs(t, ro, ErrReadOnly)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, ro, &pgErr)
	require.Equal(t, "25006", pgErr.Code)
	require.Equal(t, `rate limit "k": `+ErrReadOnly.Error()+": ERROR: cannot execute UPDATE in a read-only transaction (SQLSTATE 25006)", ro.Error())

	other := errors.New("connection refused")
	err := Wrap("sweep rate limits", other)
	require.ErrorIs(t, err, other)
	require.NotErrorIs(t, err, ErrReadOnly)
	require.Equal(t, "sweep rate limits: connection refused", err.Error())
	require.NotErrorIs(t, Wrap("x", &pgconn.PgError{Code: "23505"}), ErrReadOnly)
}
