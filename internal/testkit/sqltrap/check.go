package sqltrap

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A Finding is a statement that met a trap.
type Finding struct {
	Where string // where the statement comes from (a file and line, a function's name)
	How   string // "plan" (its generic plan calls the sentinel), "run" (running it raised SQLState), "prepare" (it prepares without the traps and not with them)
	What  string // the plan's line, or the error
}

func (f Finding) String() string { return fmt.Sprintf("%s: %s: %s", f.Where, f.How, f.What) }

// Check prepares sql on conn, whose search_path puts Schema first, EXPLAINs its generic plan
// (VERBOSE, so every expression of every node is shown) and runs it with every parameter NULL in
// a transaction that it rolls back. It returns a Finding when the plan names the sentinel, when
// the run raised SQLState, or when the statement prepares on plain (a connection without the
// trap schema on its path) but not on conn; and ok false when the statement does not prepare
// on plain either (it cannot be checked this way: a template, a statement for another role).
func Check(ctx context.Context, conn, plain *pgx.Conn, where, sql string) (f *Finding, ok bool, err error) {
	if _, perr := plain.Prepare(ctx, "", sql); perr != nil {
		return nil, false, nil
	}
	sd, perr := conn.Prepare(ctx, "fencelock_trap_check", sql)
	if perr != nil {
		return &Finding{Where: where, How: "prepare", What: perr.Error()}, true, nil
	}
	defer func() { _ = conn.Deallocate(context.WithoutCancel(ctx), "fencelock_trap_check") }()
	nulls := strings.TrimSuffix(strings.Repeat("NULL, ", len(sd.ParamOIDs)), ", ")
	explain := "EXPLAIN (VERBOSE, COSTS OFF) EXECUTE fencelock_trap_check"
	if nulls != "" {
		explain += "(" + nulls + ")"
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, true, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
		return nil, true, err
	}
	rows, err := tx.Query(ctx, explain, pgx.QueryExecModeSimpleProtocol)
	var lines []string
	if err == nil {
		lines, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if IsTrap(err) { // the planner ran it (a constant folded)
		return &Finding{Where: where, How: "plan", What: err.Error()}, true, nil
	}
	if err != nil {
		return nil, true, fmt.Errorf("%s: explain: %w", where, err)
	}
	for _, l := range lines {
		if strings.Contains(l, Sentinel) {
			return &Finding{Where: where, How: "plan", What: strings.TrimSpace(l)}, true, nil
		}
	}
	if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = '2s'; SET LOCAL lock_timeout = '1s'; SET LOCAL plan_cache_mode = auto`); err != nil {
		return nil, true, err
	}
	args := make([]any, len(sd.ParamOIDs))
	_, rerr := tx.Exec(ctx, "fencelock_trap_check", args...)
	if IsTrap(rerr) {
		return &Finding{Where: where, How: "run", What: rerr.Error()}, true, nil
	}
	return nil, true, nil
}

// IsTrap reports whether err is, or wraps, the error a trap raises.
func IsTrap(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == SQLState
}
