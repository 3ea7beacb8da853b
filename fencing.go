package fencelock

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/internal/db"
)

// FenceTx advances the high-water mark of resource to token inside tx, the caller's
// transaction, in one statement; the caller's writes in tx then commit only together with it.
// Equal tokens pass, so a holder may make several fenced writes with one grant. The fence row
// stays locked until tx ends, so fenced writes to one resource commit in token order. It raises
// synchronous_commit from off to on for tx: an acknowledged fenced write lost in a crash would take
// the high-water mark back with it.
//
// resource is 1 to [MaxNameLength] bytes of UTF-8 without NUL (often the lease name); token is
// > 0. Errors: an [*ArgumentError] before any SQL; a [*StaleTokenError] (matching
// [ErrStaleToken]) when a larger token has been seen: roll tx back at once, since it still
// holds the fence row's lock and blocks every other fenced writer of the resource until it
// ends; an error matching [ErrTokenNotIssued] (SQLSTATE FL008, nothing written) when token is
// larger than every token the database has issued; otherwise the pgx error, wrapped. A
// high-water mark above every issued token (made up, and written before migration 00017) is
// replaced by token.
//
// A fence row is the resource's memory of the newest token: never delete it on a timer. A
// paused holder can wake up any time later with its old token, and a fence row swept in the
// meantime would let that token through, as if no newer one had ever been seen. Drop a fence
// row only together with the resource it guards, in the same transaction, when nothing will
// write to that resource again. For tokens kept on the resource's own row, [UpdateFencedTx]
// needs no fence row at all, and the token goes when the row goes.
//
// A fence rejects a stale token only once a newer one has been written through it: a paused
// holder whose successor has not written yet still passes. With a lease, use [Lease.FenceTx],
// which checks the lease and advances the fence in one statement; FenceTx is for tokens that travel
// without a lease (advisory lock tokens, tokens handed to another system). Safe for concurrent use
// on different transactions (a pgx.Tx itself is not).
func FenceTx(ctx context.Context, tx pgx.Tx, resource string, token Token) error {
	if tx == nil {
		return argError("tx", "must not be nil")
	}
	return fenceTx(ctx, tx, resource, token)
}

// fenceTx is FenceTx on tx, a pgx.Tx or an adapted *sql.Tx (not nil).
func fenceTx(ctx context.Context, tx db.DBTX, resource string, token Token) error {
	if err := validateName("resource", resource); err != nil {
		return err
	}
	if err := validateToken(token); err != nil {
		return err
	}
	q := db.New()
	n, err := q.FenceAdvance(ctx, tx, db.FenceAdvanceParams{Resource: resource, Token: int64(token)})
	if err != nil {
		return wrapPg(fmt.Sprintf("fence %q", resource), err)
	}
	if n == 1 {
		return nil
	}
	cur, err := q.FenceCurrent(ctx, tx, resource)
	if err != nil {
		return wrapPg(fmt.Sprintf("fence %q: read high-water mark", resource), err)
	}
	defaultMetrics().stale(mFenceTx)
	return &StaleTokenError{Resource: resource, Token: token, Current: Token(cur)}
}

// Column is a column name and the value to compare it with or set it to, for [UpdateFencedTx].
type Column struct {
	Name  string // a column name: 1 to 63 bytes of UTF-8 without NUL; quoted, never pasted
	Value any    // any value pgx can encode for the column
}

// UpdateFencedTx updates the rows of table that match key, setting set and tokenColumn =
// token, provided the rows' tokenColumn is NULL or <= token:
//
//	UPDATE table SET set..., tokenColumn = $token
//	WHERE key... AND (tokenColumn IS NULL OR tokenColumn <= $token)
//
// This fences writes with a token column kept on the caller's own table, with no fences row. On
// a table protected by fencelock.protect_table (docs/SQL.md), it also passes token to the
// table's trigger: it sets the transaction-local fencelock.token, as fencelock.set_token does,
// for the rest of tx. It
// runs inside tx, the caller's transaction, and raises synchronous_commit from off to on for tx, so
// an acknowledged fenced update is not lost in a crash (which would let an older token through).
// table is one identifier or schema-qualified (pgx.Identifier{"public", "payments"}); every
// identifier is validated and quoted, never pasted. key and set are matched and assigned in the
// order given; key must not be empty (an unkeyed fenced update is almost surely a mistake), and set
// may be. key should pick one row: where it picks several, only those whose token column is NULL or
// <= token are updated, and the count says how many.
//
// It returns the number of rows updated (>= 1) or: an [*ArgumentError] before any SQL; a
// [*StaleTokenError] (matching [ErrStaleToken], with Table and Key set) when rows match key
// but carry a larger token; an error wrapping [ErrNoRow] when no row matches key; an error
// matching [ErrTokenNotIssued] (SQLSTATE FL008, nothing updated) when token is larger than every
// token the database has issued (a row whose token column holds such a made-up token is updated
// by any issued one); otherwise the pgx error, wrapped. The success path is one statement; telling stale from missing costs a
// second only on failure.
func UpdateFencedTx(ctx context.Context, tx pgx.Tx, table pgx.Identifier, tokenColumn string, token Token, set []Column, key []Column) (int64, error) {
	if tx == nil {
		return 0, argError("tx", "must not be nil")
	}
	return updateFencedTx(ctx, tx, table, tokenColumn, token, set, key)
}

// updateFencedTx is UpdateFencedTx on tx, a pgx.Tx or an adapted *sql.Tx (not nil).
func updateFencedTx(ctx context.Context, tx db.DBTX, table pgx.Identifier, tokenColumn string, token Token, set []Column, key []Column) (int64, error) {
	if len(table) == 0 || len(table) > 2 {
		return 0, argError("table", "must be a name or schema.name, got %d parts", len(table))
	}
	for _, part := range table {
		if err := validateIdent("table", part); err != nil {
			return 0, err
		}
	}
	if err := validateIdent("tokenColumn", tokenColumn); err != nil {
		return 0, err
	}
	if err := validateToken(token); err != nil {
		return 0, err
	}
	if len(key) == 0 {
		return 0, argError("key", "must name at least one column")
	}
	for _, c := range append(slices.Clip(set), key...) {
		if err := validateIdent("column", c.Name); err != nil {
			return 0, err
		}
		if c.Name == tokenColumn {
			return 0, argError("column", "%q is the token column; it is set and compared by UpdateFencedTx itself", c.Name)
		}
	}
	tbl := table.Sanitize()
	tok := pgx.Identifier{tokenColumn}.Sanitize()
	// $1 is the token, then the set values, then the key values.
	args := []any{int64(token)}
	for _, c := range append(slices.Clip(set), key...) {
		args = append(args, c.Value)
	}
	sets := columnsSQL(set, 2, ", ")
	if sets != "" {
		sets += ", "
	}
	// The uncorrelated sub-select (run once) raises synchronous_commit from off to on for tx,
	// as FenceTx does: with the server default off, a crash after the commit could lose the
	// acknowledged write, and the token column with it, and let an older token through again.
	// It names no table or column, so it cannot clash with the caller's names.
	// The second sets the transaction-local fencelock.token to the token, as
	// fencelock.set_token does, so that a table protected by fencelock.protect_table sees the
	// writer's token even when the token column keeps its value (the same holder writing again).
	// The first refuses, before any row is read, a token larger than every token the database
	// has issued (fencelock.check_issued: SQLSTATE FL008, ErrTokenNotIssued). A row whose token
	// column is above every issued token (written before migration 00017, or by hand) proves no
	// newer grant: the token replaces it (fencelock.issued_bound, read only for such a row).
	sql := fmt.Sprintf("UPDATE %s SET %s%s = $1 WHERE %s IS NOT NULL AND %s AND (%s IS NULL OR %s <= $1 OR %s > %s) AND %s IS NOT NULL AND %s IS NOT NULL",
		tbl, sets, tok, checkIssuedSQL, columnsSQL(key, 2+len(set), " AND "), tok, tok, tok, issuedBoundSQL, raiseSyncCommitSQL, setTokenSQL)
	tag, err := tx.Exec(ctx, sql, args...)
	if err != nil {
		return 0, wrapPg("fenced update of "+tbl, err)
	}
	if n := tag.RowsAffected(); n > 0 {
		return n, nil
	}
	// Nothing updated: stale, or no such row? The key arguments follow the token and sets.
	keyArgs := args[1+len(set):]
	var rows int64
	var current *int64
	probe := fmt.Sprintf("SELECT count(*), max(%s) FROM %s WHERE %s", tok, tbl, columnsSQL(key, 1, " AND "))
	if err := tx.QueryRow(ctx, probe, keyArgs...).Scan(&rows, &current); err != nil {
		return 0, wrapPg("fenced update of "+tbl+": probe", err)
	}
	if rows == 0 || current == nil {
		return 0, fmt.Errorf("fenced update of %s: %w", tbl, ErrNoRow)
	}
	defaultMetrics().stale(mUpdateFencedTx)
	return 0, &StaleTokenError{Table: strings.Join(table, "."), Key: describeKey(key), Token: token, Current: Token(*current)}
}

// describeKey renders key for a [StaleTokenError]: name=value pairs joined by ", ", strings
// quoted with %q, other values with %v.
func describeKey(key []Column) string {
	parts := make([]string, len(key))
	for i, c := range key {
		if s, ok := c.Value.(string); ok {
			parts[i] = fmt.Sprintf("%s=%q", c.Name, s)
		} else {
			parts[i] = fmt.Sprintf("%s=%v", c.Name, c.Value)
		}
	}
	return strings.Join(parts, ", ")
}

// raiseSyncCommitSQL raises synchronous_commit from off to on for the current transaction (any
// other setting already waits for the local flush, and is kept); the same expression as in
// the sqlc queries.
const raiseSyncCommitSQL = `(SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true))`

// setTokenSQL sets the transaction-local setting fencelock.token to $1, the writer's token,
// which the trigger of a protected table reads (migration 00014, fencelock.set_token).
const setTokenSQL = `(SELECT set_config('fencelock.token', $1::bigint::text, true))`

// checkIssuedSQL raises SQLSTATE FL008 when $1 is larger than every token the database has
// issued (migration 00017, fencelock.check_issued); issuedBoundSQL is that bound.
const (
	checkIssuedSQL = `(SELECT fencelock.check_issued($1::bigint))`
	issuedBoundSQL = `(SELECT fencelock.issued_bound())`
)

// columnsSQL renders cols as `"col" = $first<sep>"col2" = $first+1...`, names quoted.
func columnsSQL(cols []Column, first int, sep string) string {
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = fmt.Sprintf("%s = $%d", pgx.Identifier{c.Name}.Sanitize(), first+i)
	}
	return strings.Join(parts, sep)
}
