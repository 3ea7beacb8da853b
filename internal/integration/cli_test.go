package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/cli"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/migrations"
)

// Tests of the fencelock command (cmd/fencelock, internal/cli): run in-process through
// cli.Run, and, for watch, as a built binary in a tmux terminal.

// cliRun runs the fencelock command in-process against b's database (DATABASE_URL), with stdin.
func cliRun(t *testing.T, b *bundle, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	env := func(k string) string {
		if k == "DATABASE_URL" {
			return b.DB.URL
		}
		return ""
	}
	var out, errOut strings.Builder
	code = cli.Run(b.Ctx, args, env, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

// awaitWaiters waits until fencelock.holders shows waiters for lease name, failing the test
// after 10 s.
func awaitWaiters(t *testing.T, b *bundle, name string, waiters int64) {
	t.Helper()
	testkit.AwaitWaiters(t, b.Ctx, b.Pool, name, waiters)
}

// columnGap separates the columns of the command's tables (cells hold single spaces at most).
var columnGap = regexp.MustCompile(`\s{2,}`)

// tableCells splits a table the command printed into rows of cells.
func tableCells(out string) [][]string {
	var rows [][]string
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		rows = append(rows, columnGap.Split(strings.TrimSpace(line), -1))
	}
	return rows
}

// durationCell matches the command's durations ("850ms", "4.2s", "3m05s", "2h01m", "3d04h").
var durationCell = regexp.MustCompile(`^\d+(ms|\.\ds|m\d\ds|h\d\dm|d\d\dh)$`)

// normaliseLocks replaces what varies between runs in a locks table (lease tokens, TTLs left,
// durations held, backend pids and client addresses) with placeholders, and aligns it again.
// A backend shown without an address (a Unix socket) reads like one with an address.
func normaliseLocks(t *testing.T, out string) string {
	t.Helper()
	rows := tableCells(out)
	col := make(map[string]int)
	for i, h := range rows[0] {
		col[h] = i
	}
	for _, h := range []string{"KIND", "HOLDER", "TOKEN", "TTL LEFT", "HELD FOR"} {
		_, ok := col[h]
		require.True(t, ok, "no column %s in %q", h, rows[0])
	}
	pid := regexp.MustCompile(`^pid \d+( \([^)]*\))?$`)
	token := regexp.MustCompile(`^\d+$`)
	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 0, 8, 2, ' ', 0)
	for i, r := range rows {
		if i > 0 {
			require.Len(t, r, len(rows[0]), "row %q", r)
			r[col["TOKEN"]] = token.ReplaceAllString(r[col["TOKEN"]], "<token>")
			r[col["HOLDER"]] = pid.ReplaceAllString(r[col["HOLDER"]], "pid <pid> (<addr>)")
			for _, c := range []int{col["TTL LEFT"], col["HELD FOR"]} {
				r[c] = durationCell.ReplaceAllString(r[c], "<dur>")
			}
		}
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	require.NoError(t, tw.Flush())
	return sb.String()
}

// lockJSON is an object of locks --json, as a script reads it.
type lockJSON struct {
	Kind           string   `json:"kind"`
	Resource       string   `json:"resource"`
	Holder         string   `json:"holder"`
	Token          *int64   `json:"token"`
	TTLLeftSeconds *float64 `json:"ttl_left_seconds"`
	Heartbeat      string   `json:"heartbeat"`
	Renewals       *int64   `json:"renewals"`
	Waiters        int64    `json:"waiters"`
	NextHolder     *string  `json:"next_holder"`
	Key            *int64   `json:"key"`
	PID            *int32   `json:"pid"`
	Mode           string   `json:"mode"`
}

// The locks table of two held leases, one with a waiter, and a session advisory lock, against
// testdata/cli/locks.golden (FENCELOCK_UPDATE_GOLDEN=1 rewrites it); then the same as JSON.
func TestCLILocksGolden(t *testing.T) {
	t.Parallel()
	b := setup(t)
	code, out, errOut := cliRun(t, b, "", "locks")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, "no locks held\n", out)
	code, out, errOut = cliRun(t, b, "", "locks", "--json")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, "[]\n", out)

	alpha, err := newLessor(t, b.Pool, "worker-1").TryAcquire(b.Ctx, "cli:alpha", time.Minute)
	require.NoError(t, err)
	defer alpha.Release(b.Ctx)
	beta, err := newLessor(t, b.Pool, "worker-3").TryAcquire(b.Ctx, "cli:beta", time.Minute)
	require.NoError(t, err)
	defer beta.Release(b.Ctx)
	waitCtx, stopWaiting := context.WithCancel(b.Ctx)
	waiting := fencetest.AcquireAsync(waitCtx, newLessor(t, b.Pool, "worker-2"), "cli:alpha", time.Minute)
	defer func() {
		stopWaiting()
		require.ErrorIs(t, fencetest.Receive(t, waiting, 10*time.Second).Err, context.Canceled)
	}()
	awaitWaiters(t, b, "cli:alpha", 1)
	// No watchdog probe during the test: the holder's session stays idle (HELD FOR "-"), and the
	// lock, never probed, is not labelled: it shows by key, as every advisory lock held for less
	// than one watchdog interval does (issue 31).
	locker, err := fencelock.NewAdvisoryLocker(b.Pool, fencelock.WithWatchdogInterval(time.Hour))
	require.NoError(t, err)
	lk, err := locker.TryLock(b.Ctx, "cli-nightly-report")
	require.NoError(t, err)
	defer lk.Unlock(b.Ctx)

	code, out, errOut = cliRun(t, b, "", "locks")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Empty(t, errOut)
	got := normaliseLocks(t, out)
	golden := filepath.Join("testdata", "cli", "locks.golden")
	if os.Getenv("FENCELOCK_UPDATE_GOLDEN") == "1" {
		require.NoError(t, os.MkdirAll(filepath.Dir(golden), 0o755))
		require.NoError(t, os.WriteFile(golden, []byte(got), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err, "run with FENCELOCK_UPDATE_GOLDEN=1 to create it")
	require.Equal(t, string(want), got, "locks output:\n%s", out)

	code, out, errOut = cliRun(t, b, "", "locks", "--json")
	require.Equal(t, cli.ExitOK, code, errOut)
	var rows []lockJSON
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	require.Len(t, rows, 3, out)
	key, err := locker.Key("cli-nightly-report")
	require.NoError(t, err)
	wantKey, _ := key.Int64()
	for i, want := range []struct {
		kind, resource, holder string
		token                  fencelock.Token
		waiters                int64
		next                   *string
	}{
		{"lease", "cli:alpha", "worker-1", alpha.Token(), 1, ptrTo("worker-2")},
		{"lease", "cli:beta", "worker-3", beta.Token(), 0, nil},
	} {
		r := rows[i]
		require.Equal(t, want.kind, r.Kind)
		require.Equal(t, want.resource, r.Resource)
		require.Equal(t, want.holder, r.Holder)
		require.NotNil(t, r.Token)
		require.Equal(t, int64(want.token), *r.Token)
		require.Equal(t, want.waiters, r.Waiters)
		require.Equal(t, want.next, r.NextHolder)
		require.Equal(t, "ok", r.Heartbeat)
		require.Equal(t, ptrTo(int64(0)), r.Renewals)
		require.NotNil(t, r.TTLLeftSeconds)
		require.InDelta(t, 55, *r.TTLLeftSeconds, 5, "a minute's TTL, just granted")
	}
	adv := rows[2]
	require.Equal(t, "advisory", adv.Kind)
	require.Equal(t, fmt.Sprintf("key %d", wantKey), adv.Resource)
	require.Equal(t, ptrTo(int32(lk.BackendPID())), adv.PID)
	require.Equal(t, ptrTo(wantKey), adv.Key)
	require.Equal(t, "exclusive", adv.Mode)
	require.Equal(t, "session", adv.Heartbeat)
	require.Nil(t, adv.Token)

	// --name filters both kinds by resource, with SQL LIKE.
	code, out, errOut = cliRun(t, b, "", "locks", "--json", "--name", "cli:b%")
	require.Equal(t, cli.ExitOK, code, errOut)
	rows = nil
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	require.Len(t, rows, 1, out)
	require.Equal(t, "cli:beta", rows[0].Resource)
}

// Usage errors exit 2 with one line on stderr; migrate, fences and sweep run.
func TestCLIUsage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var stdout, stderr strings.Builder
	require.Equal(t, cli.ExitUsage, cli.Run(b.Ctx, []string{"locks"}, func(string) string { return "" }, nil, &stdout, &stderr))
	require.Equal(t, "fencelock: no database: give --database-url or set DATABASE_URL\n", stderr.String())

	code, _, errOut := cliRun(t, b, "", "unlock")
	require.Equal(t, cli.ExitUsage, code)
	require.Equal(t, "fencelock: unknown command \"unlock\" (see fencelock help)\n", errOut)

	code, out, _ := cliRun(t, b, "", "help")
	require.Equal(t, cli.ExitOK, code)
	require.Contains(t, out, "Exit codes:")

	// --database-url wins over DATABASE_URL.
	stderr.Reset()
	stdout.Reset()
	unreachable := func(string) string { return "postgres://nobody@127.0.0.1:1/none?connect_timeout=1" }
	require.Equal(t, cli.ExitOK, cli.Run(b.Ctx, []string{"--database-url", b.DB.URL, "migrate"}, unreachable, nil, &stdout, &stderr), stderr.String())
	require.Equal(t, fmt.Sprintf("fencelock schema at version %d\n", latestMigration(t)), stdout.String())

	// fences: the high-water mark with the lease of the same name, or none.
	lease, err := newLessor(t, b.Pool, "ledger-writer").TryAcquire(b.Ctx, "cli:ledger", time.Minute)
	require.NoError(t, err)
	defer lease.Release(b.Ctx)
	require.NoError(t, pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { return lease.FenceTx(b.Ctx, tx, "cli:ledger") }))
	require.NoError(t, pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { return fencelock.FenceTx(b.Ctx, tx, "cli:orphan", 7) }))
	code, out, errOut = cliRun(t, b, "", "fences")
	require.Equal(t, cli.ExitOK, code, errOut)
	tok := strconv.FormatInt(int64(lease.Token()), 10)
	require.Equal(t, [][]string{
		{"RESOURCE", "HIGH-WATER MARK", "HOLDER", "HOLDER TOKEN"},
		{"cli:ledger", tok, "ledger-writer", tok},
		{"cli:orphan", "7", "-", "-"},
	}, tableCells(out))

	// sweep: a row expired two hours ago goes, the held one stays; a rate-limit key idle for two
	// hours goes, one used now stays.
	_, err = b.Pool.Exec(b.Ctx, `INSERT INTO fencelock.leases (name, holder, acquired_at, expires_at)
		VALUES ('cli:old', 'h', now() - interval '3 hours', now() - interval '2 hours');
		INSERT INTO fencelock.rate_limits (key, tat, allowed, decided_at) VALUES
			('cli:idle', now() - interval '2 hours', true, now() - interval '2 hours'), ('cli:busy', now() + interval '1 second', true, now())`)
	require.NoError(t, err)
	code, out, errOut = cliRun(t, b, "", "sweep")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, "swept 1 lease row expired more than 1h00m ago, and 1 rate-limit key idle as long\n", out)
	keys, err := b.Pool.Query(b.Ctx, `SELECT key FROM fencelock.rate_limits`)
	require.NoError(t, err)
	kept, err := pgx.CollectRows(keys, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"cli:busy"}, kept)
	rows, err := b.Pool.Query(b.Ctx, `SELECT name FROM fencelock.leases ORDER BY name`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"cli:ledger"}, left)
}

// latestMigration returns the highest version among the embedded migrations.
func latestMigration(t *testing.T) int {
	t.Helper()
	files, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	latest := 0
	for _, f := range files {
		v, err := strconv.Atoi(strings.SplitN(f, "_", 2)[0])
		require.NoError(t, err, f)
		latest = max(latest, v)
	}
	return latest
}

// ptrTo returns a pointer to v.
func ptrTo[T any](v T) *T { return &v }
