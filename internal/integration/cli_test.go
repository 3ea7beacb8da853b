package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
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
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/pgtest"
)

// Tests of the fencelock command (cmd/fencelock, internal/cli): run in-process through
// cli.Run, and, for watch, as a built binary in a tmux terminal.

// cliRun runs the fencelock command in-process against b's database (DATABASE_URL), with stdin.
func cliRun(t *testing.T, b *bundle, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	env := func(k string) string {
		if k == "DATABASE_URL" {
			return b.db.URL
		}
		return ""
	}
	var out, errOut strings.Builder
	code = cli.Run(b.ctx, args, env, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

// awaitWaiters waits until fencelock.holders shows waiters for lease name, failing the test
// after 10 s.
func awaitWaiters(t *testing.T, b *bundle, name string, waiters int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int64
		err := b.pool.QueryRow(b.ctx, `SELECT coalesce((SELECT waiters FROM fencelock.holders WHERE name = $1), -1)`, name).Scan(&n)
		require.NoError(t, err)
		if n == waiters {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fencelock.holders shows %d waiters for %q, want %d", n, name, waiters)
		}
		time.Sleep(5 * time.Millisecond)
	}
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

	alpha, err := newLessor(t, b.pool, "worker-1").TryAcquire(b.ctx, "cli:alpha", time.Minute)
	require.NoError(t, err)
	defer alpha.Release(b.ctx)
	beta, err := newLessor(t, b.pool, "worker-3").TryAcquire(b.ctx, "cli:beta", time.Minute)
	require.NoError(t, err)
	defer beta.Release(b.ctx)
	waitCtx, stopWaiting := context.WithCancel(b.ctx)
	waiting := acquireAsync(waitCtx, newLessor(t, b.pool, "worker-2"), "cli:alpha", time.Minute)
	defer func() {
		stopWaiting()
		require.ErrorIs(t, receive(t, waiting, 10*time.Second).err, context.Canceled)
	}()
	awaitWaiters(t, b, "cli:alpha", 1)
	// No watchdog probe during the test: the holder's session stays idle (HELD FOR "-").
	locker, err := fencelock.NewAdvisoryLocker(b.pool, fencelock.WithWatchdogInterval(time.Hour))
	require.NoError(t, err)
	lk, err := locker.TryLock(b.ctx, "cli-nightly-report")
	require.NoError(t, err)
	defer lk.Unlock(b.ctx)

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
	require.Equal(t, "cli-nightly-report", adv.Resource)
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

// release --force ends a zombie's grant: the waiter gets the lease with the new token, which
// also fences the other resource; the zombie's fenced writes are then refused. Without --force
// it is refused; with the holder inside a guarded transaction it gives up after --lock-timeout.
func TestCLIReleaseForce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	zombie, err := newLessor(t, b.pool, "zombie", fencelock.WithoutHeartbeat()).TryAcquire(b.ctx, "cli:job", time.Minute)
	require.NoError(t, err)
	waiting := acquireAsync(b.ctx, newLessor(t, b.pool, "waiter"), "cli:job", time.Minute)
	awaitWaiters(t, b, "cli:job", 1)

	// Without --force: a usage error, nothing changes.
	code, _, errOut := cliRun(t, b, "", "release", "cli:job")
	require.Equal(t, cli.ExitUsage, code)
	require.Contains(t, errOut, "needs --force")
	require.Equal(t, leaseRow{Holder: "zombie", Token: int64(zombie.Token())}, readLease(t, b.ctx, b.pool, "cli:job"))

	// The holder inside a guarded transaction: the lease row stays locked until it ends.
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }() // on failure too: the pool closes at cleanup
	require.NoError(t, zombie.GuardTx(b.ctx, tx))
	guardPID := tx.Conn().PgConn().PID()
	start := time.Now()
	code, out, errOut := cliRun(t, b, "", "release", "--force", "--lock-timeout", "200ms", "cli:job")
	require.Equal(t, cli.ExitLockTimeout, code, "stdout %q stderr %q", out, errOut)
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	require.Regexp(t, `^fencelock: release lease "cli:job": the lease row is locked by another transaction: .*guarded transaction of its holder.*; `+
		fmt.Sprintf(`pg_blocking_pids: pid %d \(`, guardPID)+`.*--lock-timeout 200ms.*raise --lock-timeout\n$`, errOut)
	require.NoError(t, tx.Rollback(b.ctx))
	require.Equal(t, leaseRow{Holder: "zombie", Token: int64(zombie.Token())}, readLease(t, b.ctx, b.pool, "cli:job"))

	// The forced release: handed to the waiter, both resources fenced with its token.
	code, out, errOut = cliRun(t, b, "", "release", "--force", "cli:job", "--fence", "cli:other")
	require.Equal(t, cli.ExitOK, code, errOut)
	m := regexp.MustCompile(`^released lease "cli:job" held by zombie \(token (\d+)\); fenced with token (\d+) \(cli:job, cli:other\); handed to waiter\n$`).
		FindStringSubmatch(out)
	require.NotNil(t, m, out)
	require.Equal(t, strconv.FormatInt(int64(zombie.Token()), 10), m[1])
	got := receive(t, waiting, 10*time.Second)
	require.NoError(t, got.err)
	defer got.lease.Release(b.ctx)
	require.Equal(t, m[2], strconv.FormatInt(int64(got.lease.Token()), 10))

	// The zombie wakes up: its lease is gone, and its token is stale on the other resource.
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { return zombie.FenceTx(b.ctx, tx, "cli:job") })
	require.ErrorIs(t, err, fencelock.ErrLeaseLost)
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { return fencelock.FenceTx(b.ctx, tx, "cli:other", zombie.Token()) })
	require.ErrorIs(t, err, fencelock.ErrStaleToken)

}

// release --force on a lease nobody holds exits 3 (not held), as README and --help say, and
// says whether it raised the fence: a name never granted is left unchanged (no lease row, no
// fence: a mistyped name leaves nothing behind); a grant that lapsed without a successor has
// its holder fenced out all the same; a name released by force before, and not granted since,
// is left as it is.
func TestCLIReleaseForceNotHeld(t *testing.T) {
	t.Parallel()
	b := setup(t)
	type result struct {
		Lease     string   `json:"lease"`
		Held      bool     `json:"held"`
		Lapsed    bool     `json:"lapsed"`
		OldHolder *string  `json:"old_holder"`
		OldToken  *int64   `json:"old_token"`
		NewToken  *int64   `json:"new_token"`
		HandedTo  *string  `json:"handed_to"`
		Fenced    []string `json:"fenced"`
	}
	count := func(query, name string) int {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, query, name).Scan(&n))
		return n
	}
	const leaseRows = `SELECT count(*) FROM fencelock.leases WHERE name = $1`
	const fenceRows = `SELECT count(*) FROM fencelock.fences WHERE resource = $1`

	// Never granted: exit 3, nothing changed.
	code, out, errOut := cliRun(t, b, "", "release", "--force", "cli:idle", "--fence", "cli:idle-other")
	require.Equal(t, cli.ExitNotFound, code, "stdout %q stderr %q", out, errOut)
	require.Empty(t, out)
	require.Equal(t, "fencelock: release lease \"cli:idle\": not held: never granted (or not since its last forced release); nothing changed, no fence raised\n", errOut)
	code, out, errOut = cliRun(t, b, "", "release", "--force", "--json", "cli:idle")
	require.Equal(t, cli.ExitNotFound, code, errOut)
	var res result
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, result{Lease: "cli:idle", Fenced: []string{}}, res)
	require.Zero(t, count(leaseRows, "cli:idle"), "a lease row was left behind")
	require.Zero(t, count(fenceRows, "cli:idle"), "a fence was raised")
	require.Zero(t, count(fenceRows, "cli:idle-other"), "a fence was raised")

	// A lapsed grant, nobody after it: exit 3, and its holder is fenced out.
	zombie, err := newLessor(t, b.pool, "zombie", fencelock.WithoutHeartbeat()).TryAcquire(b.ctx, "cli:lapsed", 300*time.Millisecond)
	require.NoError(t, err)
	waitFor(t, b, "the grant lapses on the server", func() bool { return readLease(t, b.ctx, b.pool, "cli:lapsed").Expired })
	code, out, errOut = cliRun(t, b, "", "release", "--force", "--json", "cli:lapsed", "--fence", "cli:lapsed-other")
	require.Equal(t, cli.ExitNotFound, code, errOut)
	res = result{}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.False(t, res.Held)
	require.True(t, res.Lapsed)
	require.Equal(t, "zombie", *res.OldHolder)
	require.EqualValues(t, zombie.Token(), *res.OldToken)
	require.Greater(t, *res.NewToken, int64(zombie.Token()))
	require.Nil(t, res.HandedTo)
	require.Equal(t, []string{"cli:lapsed", "cli:lapsed-other"}, res.Fenced)
	require.Equal(t, fmt.Sprintf("fencelock: release lease \"cli:lapsed\": not held: the grant of zombie (token %d) had lapsed; fenced with token %d (cli:lapsed, cli:lapsed-other), so its holder's fenced writes are refused\n",
		zombie.Token(), *res.NewToken), errOut)
	for _, r := range res.Fenced {
		err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { return fencelock.FenceTx(b.ctx, tx, r, zombie.Token()) })
		require.ErrorIs(t, err, fencelock.ErrStaleToken, "the lapsed holder is not fenced out of %q", r)
	}

	// Released by force already, not granted since: exit 3, nothing changed.
	code, _, errOut = cliRun(t, b, "", "release", "--force", "cli:lapsed")
	require.Equal(t, cli.ExitNotFound, code, errOut)
	require.Contains(t, errOut, "nothing changed, no fence raised")
	var fence int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT token FROM fencelock.fences WHERE resource = 'cli:lapsed'`).Scan(&fence))
	require.Equal(t, *res.NewToken, fence, "the fence moved")

	// The lease is granted as usual afterwards, with a token above the fence.
	lease, err := newLessor(t, b.pool, "next").TryAcquire(b.ctx, "cli:lapsed", time.Minute)
	require.NoError(t, err)
	require.Greater(t, int64(lease.Token()), fence)
	require.NoError(t, lease.Release(b.ctx))

	// --help says the same.
	code, out, _ = cliRun(t, b, "", "help", "release")
	require.Equal(t, cli.ExitOK, code)
	require.Contains(t, out, "exit 3 when nobody does")
	require.Contains(t, out, "3  nothing held: release found no holder")
}

// release --force --advisory terminates the backend holding a session advisory lock, after a
// y/N prompt: declined, the lock stays held; with --yes the holder's Done closes and the lock
// is free. By key pair too; nothing held exits 3.
func TestCLIReleaseAdvisory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder, err := fencelock.NewAdvisoryLocker(newPool(t, b.ctx, b.db.URL), fencelock.WithWatchdogInterval(50*time.Millisecond))
	require.NoError(t, err)
	lk, err := holder.TryLock(b.ctx, "cli-report")
	require.NoError(t, err)
	pid := lk.BackendPID()
	heldBy := func(pid uint32) int {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM fencelock.advisory_locks WHERE granted AND pid = $1`, int32(pid)).Scan(&n))
		return n
	}

	code, out, errOut := cliRun(t, b, "n\n", "release", "--force", "--advisory", "cli-report")
	require.Equal(t, cli.ExitError, code, "stdout %q", out)
	require.Contains(t, errOut, fmt.Sprintf("terminate backend %d (fencelock cli-report", pid))
	require.Contains(t, errOut, fmt.Sprintf("fencelock: declined: backend %d not terminated", pid))
	require.Empty(t, out)
	require.Equal(t, 1, heldBy(pid))
	require.NoError(t, lk.Err())

	code, out, errOut = cliRun(t, b, "", "release", "--force", "--advisory", "--yes", "cli-report")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Regexp(t, fmt.Sprintf(`^terminated backend %d \(fencelock cli-report.*\), which held advisory lock "cli-report" \(key -?\d+\)\n$`, pid), out)
	select {
	case <-lk.Done():
		require.ErrorIs(t, lk.Err(), fencelock.ErrLockLost)
	case <-time.After(5 * time.Second):
		t.Fatal("the terminated holder's Done did not close within 5s")
	}
	other, err := fencelock.NewAdvisoryLocker(b.pool)
	require.NoError(t, err)
	again, err := other.TryLock(b.ctx, "cli-report")
	require.NoError(t, err)
	require.NoError(t, again.Unlock(b.ctx))

	// By key pair.
	pair, err := holder.TryLock(b.ctx, "", fencelock.AtKey(fencelock.Int32PairKey(7, 8)))
	require.NoError(t, err)
	code, out, errOut = cliRun(t, b, "", "release", "--force", "--advisory", "--yes", "--json", "7,8")
	require.Equal(t, cli.ExitOK, code, errOut)
	var res struct {
		Terminated []struct {
			PID int32 `json:"pid"`
		} `json:"terminated"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Len(t, res.Terminated, 1)
	require.Equal(t, int32(pair.BackendPID()), res.Terminated[0].PID)
	select {
	case <-pair.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the terminated holder's Done did not close within 5s")
	}

	code, _, errOut = cliRun(t, b, "", "release", "--force", "--advisory", "cli-report")
	require.Equal(t, cli.ExitNotFound, code)
	require.Regexp(t, `^fencelock: no backend holds advisory lock "cli-report" \(key -?\d+\)\n$`, errOut)
}

// Usage errors exit 2 with one line on stderr; migrate, fences and sweep run.
func TestCLIUsage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var stdout, stderr strings.Builder
	require.Equal(t, cli.ExitUsage, cli.Run(b.ctx, []string{"locks"}, func(string) string { return "" }, nil, &stdout, &stderr))
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
	require.Equal(t, cli.ExitOK, cli.Run(b.ctx, []string{"--database-url", b.db.URL, "migrate"}, unreachable, nil, &stdout, &stderr), stderr.String())
	require.Equal(t, fmt.Sprintf("fencelock schema at version %d\n", latestMigration(t)), stdout.String())

	// fences: the high-water mark with the lease of the same name, or none.
	lease, err := newLessor(t, b.pool, "ledger-writer").TryAcquire(b.ctx, "cli:ledger", time.Minute)
	require.NoError(t, err)
	defer lease.Release(b.ctx)
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { return lease.FenceTx(b.ctx, tx, "cli:ledger") }))
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { return fencelock.FenceTx(b.ctx, tx, "cli:orphan", 7) }))
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
	_, err = b.pool.Exec(b.ctx, `INSERT INTO fencelock.leases (name, holder, acquired_at, expires_at)
		VALUES ('cli:old', 'h', now() - interval '3 hours', now() - interval '2 hours');
		INSERT INTO fencelock.rate_limits (key, tat, allowed, decided_at) VALUES
			('cli:idle', now() - interval '2 hours', true, now() - interval '2 hours'), ('cli:busy', now() + interval '1 second', true, now())`)
	require.NoError(t, err)
	code, out, errOut = cliRun(t, b, "", "sweep")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, "swept 1 lease row expired more than 1h00m ago, and 1 rate-limit key idle as long\n", out)
	keys, err := b.pool.Query(b.ctx, `SELECT key FROM fencelock.rate_limits`)
	require.NoError(t, err)
	kept, err := pgx.CollectRows(keys, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"cli:busy"}, kept)
	rows, err := b.pool.Query(b.ctx, `SELECT name FROM fencelock.leases ORDER BY name`)
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

// watch --json prints one array per refresh, one a line, and ends at a line "q" on stdin.
func TestCLIWatchJSON(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stdinR, stdinW := io.Pipe()
	stdoutR, stdoutW := io.Pipe()
	// Ends watch's reader of stdin; and, should the test fail early, watch itself (its next
	// write fails).
	t.Cleanup(func() { stdinW.Close(); stdoutR.Close() })
	env := func(k string) string { return map[string]string{"DATABASE_URL": b.db.URL}[k] }
	exited := make(chan int, 1)
	go func() {
		exited <- cli.Run(b.ctx, []string{"watch", "--json", "--interval", "20ms"}, env, stdinR, stdoutW, io.Discard)
		stdoutW.Close()
	}()
	lines := bufio.NewScanner(stdoutR)
	next := func() []lockJSON {
		t.Helper()
		require.True(t, lines.Scan(), "watch stopped printing: %v", lines.Err())
		var rows []lockJSON
		require.NoError(t, json.Unmarshal(lines.Bytes(), &rows), lines.Text())
		return rows
	}
	require.Empty(t, next())
	lease, err := newLessor(t, b.pool, "watched").TryAcquire(b.ctx, "cli:watched", time.Minute)
	require.NoError(t, err)
	defer lease.Release(b.ctx)
	deadline := time.Now().Add(10 * time.Second)
	for rows := next(); len(rows) != 1 || rows[0].Resource != "cli:watched" || *rows[0].Token != int64(lease.Token()); rows = next() {
		require.True(t, time.Now().Before(deadline), "watch did not show the lease within 10s: %+v", rows)
	}
	_, err = io.WriteString(stdinW, "q\n")
	require.NoError(t, err)
	go io.Copy(io.Discard, stdoutR) // the refreshes until it sees the q
	select {
	case code := <-exited:
		require.Equal(t, cli.ExitOK, code)
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end within 10s of q")
	}
}

// watch, built and run in a tmux terminal: the header and "no locks held", then a lease as it
// is taken, then a single q (no Enter: the terminal is in cbreak mode) ends it with exit code 0.
func TestCLIWatchInTmux(t *testing.T) {
	t.Parallel()
	tmux := pgtest.LookProgram(t, "tmux", "apt-get install tmux")
	b := setup(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "fencelock")
	// go test puts its own GOROOT/bin first on the PATH of the test.
	build := exec.CommandContext(b.ctx, "go", "build", "-o", bin, "github.com/fencelock/fencelock/cmd/fencelock")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	rc := filepath.Join(dir, "rc")
	script := filepath.Join(dir, "watch.sh")
	require.NoError(t, os.WriteFile(script, []byte(fmt.Sprintf("#!/bin/sh\nDATABASE_URL=%s %s watch --interval 200ms\necho $? > %s\n",
		shellQuote(b.db.URL), shellQuote(bin), shellQuote(rc))), 0o755))

	// A server of its own, its socket in the test's directory (tmux -L would leave it in
	// /tmp/tmux-UID after kill-server).
	socket := filepath.Join(dir, "tmux.sock")
	tm := func(args ...string) (string, error) {
		// -u: the pane is UTF-8 whatever the locale; -f /dev/null: no user configuration.
		cmd := exec.CommandContext(b.ctx, tmux, append([]string{"-u", "-S", socket, "-f", "/dev/null"}, args...)...)
		cmd.Env = append(envWithout("TMUX"), "TERM=xterm")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() { _, _ = tm("kill-server") })
	_, err = tm("new-session", "-d", "-x", "160", "-y", "40", "-s", "w", script)
	require.NoError(t, err)
	awaitPane := func(what string, ok func(pane string) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		var pane string
		for time.Now().Before(deadline) {
			p, err := tm("capture-pane", "-p", "-t", "w")
			if pane = p; err == nil && ok(pane) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("the pane did not show %s within 10s; it shows:\n%s", what, pane)
	}
	awaitPane("the header and no locks", func(p string) bool {
		return strings.Contains(p, "fencelock watch — ") && strings.Contains(p, "/"+b.db.Name+" — ") &&
			strings.Contains(p, "— q to quit") && strings.Contains(p, "no locks held")
	})
	lease, err := newLessor(t, b.pool, "worker-tmux").TryAcquire(b.ctx, "cli:tmux-job", time.Minute)
	require.NoError(t, err)
	defer lease.Release(b.ctx)
	awaitPane("the lease", func(p string) bool {
		return regexp.MustCompile(`(?m)^lease +cli:tmux-job +worker-tmux +` + strconv.FormatInt(int64(lease.Token()), 10) + ` `).MatchString(p)
	})

	_, err = tm("send-keys", "-t", "w", "q")
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := tm("has-session", "-t", "w"); err != nil {
			break // the script, and so the session, has ended
		}
		if time.Now().After(deadline) {
			pane, _ := tm("capture-pane", "-p", "-t", "w")
			t.Fatalf("watch did not exit within 10s of q; the pane shows:\n%s", pane)
		}
		time.Sleep(50 * time.Millisecond)
	}
	code, err := os.ReadFile(rc)
	require.NoError(t, err, "the script did not record watch's exit code")
	require.Equal(t, "0\n", string(code))
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// envWithout returns the environment without the variable name.
func envWithout(name string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, name+"=") {
			env = append(env, kv)
		}
	}
	return env
}

// ptrTo returns a pointer to v.
func ptrTo[T any](v T) *T { return &v }
