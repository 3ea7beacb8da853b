package testkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// NewRole creates a LOGIN role with a password on owner's server, runs grants as owner (a
// format in which %[1]s is the role's quoted name and %[2]s the quoted name of owner's
// database), and returns the role's name and a pool of connections as that role to url's
// database, closed at test cleanup. Roles are cluster-wide: the role is dropped at cleanup,
// after its pool is closed, by DROP OWNED (its privileges in the database, and on the
// database) and DROP ROLE, once its sessions left by a failed test have been ended.
func NewRole(t testing.TB, ctx context.Context, owner *pgxpool.Pool, url, grants string) (string, *pgxpool.Pool) {
	t.Helper()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	role := "role_" + hex.EncodeToString(rnd[:])
	password := hex.EncodeToString(rnd[:]) + "-pw"
	ident := pgx.Identifier{role}.Sanitize()
	var dbName string
	require.NoError(t, owner.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName))

	_, err := owner.Exec(ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s'`, ident, password))
	require.NoError(t, err)
	t.Cleanup(func() { // registered first: runs after the pool closes
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = owner.Exec(cctx, `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
			WHERE usename = $1 AND datname = current_database()`, role)
		if _, err := owner.Exec(cctx, fmt.Sprintf(`DROP OWNED BY %[1]s; DROP ROLE %[1]s`, ident)); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	_, err = owner.Exec(ctx, fmt.Sprintf(grants, ident, pgx.Identifier{dbName}.Sanitize()))
	require.NoError(t, err)
	return role, NewPool(t, ctx, url, func(c *pgxpool.Config) { c.ConnConfig.User, c.ConnConfig.Password = role, password })
}
