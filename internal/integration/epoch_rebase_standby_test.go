package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/pgtest"
)

// rebaseApplyDelay holds back the standbys' replay of each commit in
// TestRebaseTokenEpochWaitsForStandbys (recovery_min_apply_delay, which a primary ignores and
// its standbys inherit): a rebase that returned without waiting for the replay would find the
// standbys without it.
const rebaseApplyDelay = 500 * time.Millisecond

// rebaseStandbySettings are the settings of the primaries of these tests, which their
// standbys inherit. A standby's WAL receiver then reports its replay position only when it
// receives WAL, or when it replays a commit that asks for a report (synchronous_commit =
// remote_apply): never on its own timer, so a wait that ends has been told.
var rebaseStandbySettings = []pgtest.Option{
	pgtest.Crashable(),
	pgtest.WithSetting("wal_receiver_status_interval", "1h"),
}

// rebaseStandbyPair starts a primary with rebaseStandbySettings, a fresh database on it and
// one standby, and returns once the standby has replayed the database's creation.
func rebaseStandbyPair(t *testing.T, ctx context.Context) (primary *pgtest.Server, db *pgtest.DB, standby *pgtest.Server) {
	t.Helper()
	primary = pgtest.NewServer(t, rebaseStandbySettings...)
	db = primary.NewDB(t)
	standby = primary.NewStandby(t)
	require.NoError(t, primary.WaitReplay(ctx, standby))
	return primary, db, standby
}

// soleWALSender returns the WAL sender of pool's server (walSenderNames) once there is exactly
// one, failing the test when there is none or several for 30 s. A standby that has replayed
// the primary's WAL may still be between two connections of its WAL receiver for a moment (a
// quiet run of the suite once listed none right after the standby had replayed).
func soleWALSender(t *testing.T, ctx context.Context, pool *pgxpool.Pool) fencelock.PendingStandby {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		senders := walSenderNames(t, ctx, pool)
		if len(senders) == 1 {
			return senders[0]
		}
		require.True(t, time.Now().Before(deadline), "WAL senders after 30 s: %v", senders)
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// epochOffset reads fencelock.token_epoch.epoch_offset on pool's server (a standby too).
func epochOffset(t *testing.T, ctx context.Context, pool *pgxpool.Pool) uint32 {
	t.Helper()
	var off int32
	require.NoError(t, pool.QueryRow(ctx, `SELECT epoch_offset FROM fencelock.token_epoch`).Scan(&off))
	return uint32(off)
}

// walSenderNames returns application_name and client_addr of the WAL senders of pool's
// server, as its superuser sees them in pg_stat_replication.
func walSenderNames(t *testing.T, ctx context.Context, pool *pgxpool.Pool) []fencelock.PendingStandby {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT application_name, host(client_addr) FROM pg_stat_replication ORDER BY pid`)
	require.NoError(t, err)
	var out []fencelock.PendingStandby
	for rows.Next() {
		var s fencelock.PendingStandby
		require.NoError(t, rows.Scan(&s.ApplicationName, &s.ClientAddr))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// rebaseWaitingApp is the application_name of the sessions of rebaseUntilWaiting's calls.
const rebaseWaitingApp = "rebase-until-waiting"

// rebaseUntilWaiting runs RebaseTokenEpochOpts(ctx, pool, atLeast, opts...) on a pool of its
// own on url (application_name rebaseWaitingApp), and ends that call's ctx (cancels it) once
// the call is seen waiting for the standbys or slots that lack the rebase, in primary's
// pg_stat_activity: its session has sent the empty commit (replayNudgeSQL) that the call sends
// only while it waits, or has shown four starts of its read of pg_stat_replication
// (query_start: a read shows at its Bind and at its Execute, the first one also at its Parse,
// so four make two reads at least, and the call reads again only while someone is behind). It
// returns what the call returned and how long after it began. It fails the test when the call
// returns before it is seen waiting (it did not wait), or when ctx ends first. Waiting for
// that moment, not for a timeout, leaves the call the time its commit takes on a loaded
// machine (a 2 s timeout once ended it before the commit).
func rebaseUntilWaiting(t *testing.T, ctx context.Context, primary *pgxpool.Pool, url string, atLeast uint32,
	opts ...fencelock.RebaseOption) (uint32, time.Duration, error) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = rebaseWaitingApp
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		epoch uint32
		err   error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		e, err := fencelock.RebaseTokenEpochOpts(rctx, pool, atLeast, opts...)
		done <- result{e, err}
	}()
	reads := map[string]bool{} // pid and query_start of the reads of pg_stat_replication seen
	for nudged := false; !nudged && len(reads) < 4; {
		select {
		case r := <-done:
			t.Fatalf("the rebase returned (%d, %v) after %v, before it was seen waiting for the standbys or slots behind it",
				r.epoch, r.err, time.Since(start).Round(time.Millisecond))
		case <-ctx.Done():
			t.Fatalf("the rebase was not seen waiting before the test's end: %v", ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
		rows, err := primary.Query(ctx, `SELECT pid || ' ' || query_start::text, query LIKE '%pg_current_xact_id%'
			FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1 AND query_start IS NOT NULL
			  AND (query LIKE 'WITH target AS%' OR query LIKE '%pg_current_xact_id%')`, rebaseWaitingApp)
		require.NoError(t, err)
		for rows.Next() {
			var read string
			var nudge bool
			require.NoError(t, rows.Scan(&read, &nudge))
			nudged = nudged || nudge
			if !nudge {
				reads[read] = true
			}
		}
		require.NoError(t, rows.Err())
	}
	cancel()
	select {
	case r := <-done:
		return r.epoch, time.Since(start), r.err
	case <-ctx.Done():
		t.Fatalf("the rebase did not return once cancelled: %v", ctx.Err())
		return 0, 0, nil
	}
}

// RebaseTokenEpoch returns only once every standby streaming from the primary has replayed
// the rebase: read on each standby right after the call returns, the offset is the new one,
// although each standby applies commits only 500 ms after they were made. Then a standby is
// promoted after a crash of the primary, and its tokens are above the rebased epoch (and
// above a token the old primary issued in it): tokens never go backwards. The promoted
// server has no standby, and a rebase there returns at once. Run with the server's default
// synchronous_commit (on), with off (where the rebase's commit must still be flushed before
// the position it waits for is read), and with a synchronous standby (where the commit does
// not ask the standbys for a report when they replay it, and the call commits empty
// transactions until they report it).
func TestRebaseTokenEpochWaitsForStandbys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts []pgtest.Option
		sync string // synchronous_standby_names
	}{
		{"Async", nil, ""},
		{"AsyncCommitOff", []pgtest.Option{pgtest.AsyncCommit()}, ""},
		{"SyncStandby", nil, "*"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			delay := pgtest.WithSetting("recovery_min_apply_delay", fmt.Sprintf("%dms", rebaseApplyDelay.Milliseconds()))
			primary := pgtest.NewServer(t, slices.Concat(rebaseStandbySettings, tc.opts, []pgtest.Option{delay})...)
			db := primary.NewDB(t)
			standbys := []*pgtest.Server{primary.NewStandby(t), primary.NewStandby(t)}
			var standbyPools []*pgxpool.Pool
			for _, s := range standbys {
				require.NoError(t, primary.WaitReplay(ctx, s)) // streaming: replayed what it was sent
				standbyPools = append(standbyPools, newPool(t, ctx, s.URL(db.Name)))
			}
			require.Len(t, walSenderNames(t, ctx, db.Pool), 2, "both standbys stream from the primary")
			if tc.sync != "" {
				require.NoError(t, primary.SetSynchronousStandbys(ctx, tc.sync))
			}
			before, err := fencetest.LeaseGrantToken(t, ctx, db.Pool, 0)
			require.NoError(t, err)
			require.EqualValues(t, 1, before.Epoch())

			// The rebase's own bound: a wait that is never told of the replay fails here
			// (the primary's WAL senders ask for a report only every 30 s).
			rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
			start := time.Now()
			epoch, err := fencelock.RebaseTokenEpoch(rctx, db.Pool, 10)
			elapsed := time.Since(start)
			rcancel()
			require.NoError(t, err)
			require.EqualValues(t, 10, epoch)
			for i, p := range standbyPools {
				require.EqualValues(t, epoch-1, epochOffset(t, ctx, p), "standby %d has not replayed the rebase when the call returns", i)
			}
			require.GreaterOrEqual(t, elapsed, rebaseApplyDelay, "the standbys apply the commit that late")
			t.Logf("rebase returned after %v (standbys apply commits %v late)", elapsed.Round(time.Millisecond), rebaseApplyDelay)

			after, err := fencetest.LeaseGrantToken(t, ctx, db.Pool, 1)
			require.NoError(t, err)
			require.Equal(t, epoch, after.Epoch())

			require.NoError(t, primary.Crash(ctx))
			require.NoError(t, standbys[0].Promote(ctx))
			promoted := standbyPools[0]
			for i, tp := range fencetest.TokenPaths {
				token, err := tp.Issue(t, ctx, promoted, 100+i)
				require.NoError(t, err, tp.Desc)
				require.GreaterOrEqual(t, token.Epoch(), epoch, "%s: a token after the promotion is below the rebased epoch", tp.Desc)
				require.Equal(t, epoch+1, token.Epoch(), "%s: timeline 2 plus the offset", tp.Desc)
				require.Greater(t, token, after, "%s: a token went backwards across the promotion", tp.Desc)
			}
			again, err := fencelock.RebaseTokenEpoch(ctx, promoted, 0)
			require.NoError(t, err, "no standby: nothing to wait for")
			require.Equal(t, epoch+2, again, "above the tokens of epoch %d just issued", epoch+1)
		})
	}
}

// A rebase whose standby does not receive it (the primary's WAL sender is stopped): the call
// waits, and gives up when its ctx ends (cancelled once it is seen waiting: rebaseUntilWaiting),
// with an error that wraps the ctx's, names the standby and says that the rebase is committed
// on the primary, where the next token indeed has the new epoch. That standby is then promoted after a crash of the primary: the case
// the error warns about. The promoted server lacks the rebase, and its tokens fall below the
// token the old primary issued after it (tokens went backwards); the rebase the error asks
// for on the promoted server (atLeast = Epoch + 1) puts them above it again.
func TestRebaseTokenEpochStandbyBehind(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t)
	primary, db, standby := rebaseStandbyPair(t, ctx)
	walSender := soleWALSender(t, ctx, db.Pool)
	before, err := fencetest.LeaseGrantToken(t, ctx, db.Pool, 0)
	require.NoError(t, err)
	require.NoError(t, primary.WaitReplay(ctx, standby))
	n, err := primary.PauseWALSenders(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	epoch, elapsed, err := rebaseUntilWaiting(t, ctx, db.Pool, db.URL, 10)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, fencelock.ErrRebaseNotReplayed)
	var rerr *fencelock.RebaseReplayError
	require.ErrorAs(t, err, &rerr)
	require.EqualValues(t, 10, epoch, "the committed epoch comes with the error")
	require.EqualValues(t, 10, rerr.Epoch)
	require.NotEmpty(t, rerr.LSN)
	require.Len(t, rerr.Standbys, 1)
	got := rerr.Standbys[0]
	require.Equal(t, walSender.ApplicationName, got.ApplicationName)
	require.Equal(t, "127.0.0.1", got.ClientAddr)
	require.False(t, got.Disconnected)
	require.NotEmpty(t, got.ReplayLSN)
	var behind bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT $1::pg_lsn < $2::pg_lsn`, got.ReplayLSN, rerr.LSN).Scan(&behind))
	require.True(t, behind, "replayed up to %s, the rebase is at %s", got.ReplayLSN, rerr.LSN)
	for _, want := range []string{"committed on the primary", got.ApplicationName, "127.0.0.1", rerr.LSN, "context canceled", "atLeast 11"} {
		require.ErrorContains(t, err, want)
	}
	t.Logf("after %v: %v", elapsed.Round(time.Millisecond), err)

	// Committed on the primary: its next token has the new epoch. This grant is lost with the
	// failover too.
	lost, err := fencetest.LeaseGrantToken(t, ctx, db.Pool, 1)
	require.NoError(t, err)
	require.Equal(t, epoch, lost.Epoch())

	require.NoError(t, primary.Crash(ctx))
	require.NoError(t, standby.Promote(ctx))
	promoted := newPool(t, ctx, standby.URL(db.Name))
	require.Zero(t, epochOffset(t, ctx, promoted), "the promotion lost the rebase")
	token, err := fencetest.LeaseGrantToken(t, ctx, promoted, 2)
	require.NoError(t, err)
	require.EqualValues(t, 2, token.Epoch(), "timeline 2, no offset")
	require.Greater(t, token, before, "above every token the standby received")
	require.Less(t, token, lost, "the case the error warns about: below a token the old primary issued after the rebase")

	fixed, err := fencelock.RebaseTokenEpoch(ctx, promoted, rerr.Epoch+1)
	require.NoError(t, err)
	require.Equal(t, rerr.Epoch+1, fixed)
	token, err = fencetest.LeaseGrantToken(t, ctx, promoted, 3)
	require.NoError(t, err)
	require.Greater(t, token, lost, "after the rebase the error asks for")
}

// A standby that received the rebase but has not replayed it (pg_wal_replay_pause) keeps the
// call waiting until its ctx ends (cancelled once it is seen waiting: rebaseUntilWaiting), and
// the error names it. Called again (the remedy the
// error gives), the call waits for the same standby, also across a reconnection: its WAL
// sender is terminated while the call waits, and a new one of the same standby reports the
// replay once it resumes. Until then the call has not returned; after, the standby has the
// rebase.
func TestRebaseTokenEpochReplayPaused(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t)
	_, db, standby := rebaseStandbyPair(t, ctx)
	standbyPool := newPool(t, ctx, standby.URL(db.Name))
	_, err := standbyPool.Exec(ctx, `SELECT pg_wal_replay_pause()`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var state string
		return standbyPool.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state()`).Scan(&state) == nil && state == "paused"
	}, 30*time.Second, 5*time.Millisecond)

	epoch, _, err := rebaseUntilWaiting(t, ctx, db.Pool, db.URL, 10)
	require.ErrorIs(t, err, context.Canceled)
	var rerr *fencelock.RebaseReplayError
	require.ErrorAs(t, err, &rerr)
	require.EqualValues(t, 10, epoch)
	require.Len(t, rerr.Standbys, 1)
	require.Equal(t, "127.0.0.1", rerr.Standbys[0].ClientAddr)
	require.Zero(t, epochOffset(t, ctx, standbyPool), "replay is paused")

	// Again, from a pool whose sessions are told apart by their application_name.
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = "rebase-again"
	again, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(again.Close)
	type result struct {
		epoch uint32
		err   error
	}
	done := make(chan result, 1)
	go func() {
		e, err := fencelock.RebaseTokenEpoch(ctx, again, 10)
		done <- result{e, err}
	}()
	// The call is waiting, its list of standbys read, once one of its sessions has sent the
	// empty commit that it sends while a standby has not reported the replay (a read of
	// pg_stat_replication shows in pg_stat_activity before it runs: pgx prepares it first).
	// Then the standby's WAL sender is ended.
	var sender int32
	require.Eventually(t, func() bool {
		var waiting bool
		return db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE application_name = 'rebase-again' AND query LIKE '%pg_current_xact_id%')`).Scan(&waiting) == nil && waiting
	}, 30*time.Second, 2*time.Millisecond, "the second call waits for the standby")
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pid FROM pg_stat_replication`).Scan(&sender))
	var terminated bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 10000)`, sender).Scan(&terminated))
	require.True(t, terminated)
	select {
	case r := <-done:
		t.Fatalf("the call returned (%d, %v) while the standby's replay is paused", r.epoch, r.err)
	default:
	}

	_, err = standbyPool.Exec(ctx, `SELECT pg_wal_replay_resume()`)
	require.NoError(t, err)
	r := <-done
	require.NoError(t, r.err)
	require.EqualValues(t, 10, r.epoch)
	require.EqualValues(t, 9, epochOffset(t, ctx, standbyPool), "the standby has replayed the rebase when the call returns")
	var newSender int32
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pid FROM pg_stat_replication`).Scan(&newSender))
	require.NotEqual(t, sender, newSender, "the standby reconnected")
}

// A role with only README.md's least-privilege grants sees the primary's WAL senders listed
// but not their progress: the rebase commits, and the call returns at once with an error
// wrapping ErrReplayNotVisible that names the standby (application_name only: its address is
// hidden too) instead of waiting for what it cannot see. Granted pg_monitor, the role's
// rebase waits for the standby like the superuser's.
func TestRebaseTokenEpochReplayNotVisible(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t)
	_, db, standby := rebaseStandbyPair(t, ctx)
	walSender := soleWALSender(t, ctx, db.Pool)

	// The role and grants of privilege_test.go's newLeastPrivilegeRole (the role is dropped
	// with the server).
	const role, password = "app_rebase", "app-rebase-pw"
	ident, dbIdent := pgx.Identifier{role}.Sanitize(), pgx.Identifier{db.Name}.Sanitize()
	_, err := db.Pool.Exec(ctx, fmt.Sprintf(`CREATE ROLE %[1]s LOGIN PASSWORD '%[3]s';
		GRANT CONNECT ON DATABASE %[2]s TO %[1]s;
		GRANT USAGE ON SCHEMA fencelock TO %[1]s;
		GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA fencelock TO %[1]s;
		GRANT USAGE ON ALL SEQUENCES IN SCHEMA fencelock TO %[1]s`, ident, dbIdent, password))
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, password
	app, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(app.Close)

	epoch, err := fencelock.RebaseTokenEpoch(ctx, app, 10)
	require.ErrorIs(t, err, fencelock.ErrReplayNotVisible)
	require.ErrorIs(t, err, fencelock.ErrRebaseNotReplayed)
	require.False(t, errors.Is(err, context.DeadlineExceeded), "it did not wait")
	var rerr *fencelock.RebaseReplayError
	require.ErrorAs(t, err, &rerr)
	require.EqualValues(t, 10, epoch)
	require.Len(t, rerr.Standbys, 1)
	require.Equal(t, fencelock.PendingStandby{ApplicationName: walSender.ApplicationName}, rerr.Standbys[0])
	require.ErrorContains(t, err, "pg_read_all_stats")
	t.Log(err)
	require.EqualValues(t, 9, epochOffset(t, ctx, db.Pool), "the rebase is committed on the primary")

	_, err = db.Pool.Exec(ctx, fmt.Sprintf(`GRANT pg_monitor TO %s`, ident))
	require.NoError(t, err)
	epoch, err = fencelock.RebaseTokenEpoch(ctx, app, 20)
	require.NoError(t, err)
	require.EqualValues(t, 20, epoch)
	require.EqualValues(t, 19, epochOffset(t, ctx, newPool(t, ctx, standby.URL(db.Name))), "replayed when the call returns")
}
