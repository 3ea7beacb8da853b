package fencelock

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/advisory"
	"github.com/fencelock/fencelock/internal/testkit"
)

// labelPool opens a pool of one session (the one each lock takes, so every lock of a test
// runs on the same backend), named "at-connect" by its startup packet and then before by a
// set_config after connect: the name a lock's unlock must put back is then known only from
// the server's ParameterStatus reports.
func labelPool(t *testing.T, b *bundle, before string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.DB.URL)
	require.NoError(t, err)
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["application_name"] = "at-connect"
	pool, err := pgxpool.NewWithConfig(b.Ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(b.Ctx, `SELECT set_config('application_name', $1, false)`, before)
	require.NoError(t, err)
	return pool
}

// labelState is what operators see of a held lock's backend: its application_name in
// pg_stat_activity, and its granted row of fencelock.advisory_locks (the key as taken, "42" or
// "(1,2)", and the name read from the label, nil when unlabelled or labelled by key).
type labelState struct {
	app, key string
	name     *string
}

func readLabelState(t *testing.T, b *bundle, pid uint32) labelState {
	t.Helper()
	var s labelState
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `
		SELECT a.application_name, coalesce(l.key::text, '(' || l.key1 || ',' || l.key2 || ')'), l.name
		FROM pg_stat_activity AS a JOIN fencelock.advisory_locks AS l ON l.pid = a.pid AND l.granted
		WHERE a.pid = $1`, int32(pid)).Scan(&s.app, &s.key, &s.name))
	return s
}

// appOf returns the application_name of backend pid, as pg_stat_activity shows it.
func appOf(t *testing.T, b *bundle, pid uint32) string {
	t.Helper()
	var app string
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT application_name FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&app))
	return app
}

// Session locks are labelled lazily (issue 31), for each statement form: int64 keys exclusive
// and shared, tried and awaited, by name and by key; pair keys; and a declared session pooler
// (the nine-argument statement).
//   - A lock just taken is not labelled: its session keeps the application_name it had, and
//     fencelock.advisory_locks shows its key with a NULL name. Its Unlock leaves the
//     application_name as it is (here one changed while the lock was held, which a restoring
//     unlock would have overwritten).
//   - A lock held past the watchdog's first probe is labelled "fencelock <name>" ("fencelock
//     key <key>" without a name), and the view shows its name; later probes do not label it
//     again (here the name is changed after the label, and a later probe keeps it). Its Unlock
//     puts back the application_name the session had at the grant, one set after connect.
func TestAdvisoryLabelLazy(t *testing.T) {
	t.Parallel()
	var (
		tryLock = (*AdvisoryLocker).TryLock
		lock    = (*AdvisoryLocker).Lock
	)
	for _, tc := range []struct {
		desc       string
		take       func(*AdvisoryLocker, context.Context, string, ...LockOption) (*AdvisoryLock, error)
		name       string
		opts       []LockOption
		lockerOpts []AdvisoryOption
		label      string
		viewName   *string // the view's name once labelled
	}{
		{"Int64Key", tryLock, "job", nil, nil, "fencelock job", new("job")},
		{"Int64KeyWait", lock, "job", nil, nil, "fencelock job", new("job")},
		{"Shared", tryLock, "job", []LockOption{Shared}, nil, "fencelock job", new("job")},
		{"SharedWait", lock, "job", []LockOption{Shared}, nil, "fencelock job", new("job")},
		{"Int64KeyUnnamed", tryLock, "", []LockOption{AtKey(Int64Key(-42))}, nil, "fencelock key -42", nil},
		{"PairKey", tryLock, "pair-job", []LockOption{AtKey(Int32PairKey(1, 2))}, nil, "fencelock pair-job", new("pair-job")},
		{"PairKeySharedUnnamed", lock, "", []LockOption{AtKey(Int32PairKey(-3, 4)), Shared}, nil, "fencelock key (-3,4)", nil},
		{"SessionPooler", tryLock, "job", nil, []AdvisoryOption{WithSessionPooler()}, "fencelock job", new("job")},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			pool := labelPool(t, b, "set after connect")
			var lk *AdvisoryLock
			t.Cleanup(func() { // before pool.Close, which waits for the lock's connection
				if lk != nil {
					_ = lk.Unlock(context.Background())
				}
			})
			newLocker := func(interval time.Duration) *AdvisoryLocker {
				a, err := NewAdvisoryLocker(pool, append([]AdvisoryOption{WithWatchdogInterval(interval)}, tc.lockerOpts...)...)
				require.NoError(t, err)
				return a
			}

			// Not labelled: no probe within the hour.
			lk, err := tc.take(newLocker(time.Hour), b.Ctx, tc.name, tc.opts...)
			require.NoError(t, err)
			require.Equal(t, labelState{app: "set after connect", key: lk.Key().String()}, readLabelState(t, b, lk.BackendPID()),
				"a lock just taken keeps the session's name, and shows by key")
			require.NoError(t, execOnSession(b.Ctx, lk, `SELECT set_config('application_name', 'renamed while held', false)`))
			require.NoError(t, lk.Unlock(b.Ctx))
			require.Equal(t, "renamed while held", appOf(t, b, lk.BackendPID()), "an unlabelled lock's unlock leaves application_name alone")

			// Labelled by the first probe.
			lk, err = tc.take(newLocker(time.Second), b.Ctx, tc.name, tc.opts...)
			require.NoError(t, err)
			pid := lk.BackendPID()
			wctx, cancel := context.WithTimeout(b.Ctx, 10*time.Second)
			defer cancel()
			testkit.WaitFor(t, wctx, "the watchdog's first probe labels the session", func() bool {
				return appOf(t, b, pid) == tc.label
			})
			require.Equal(t, labelState{app: tc.label, key: lk.Key().String(), name: tc.viewName}, readLabelState(t, b, pid))
			require.NoError(t, lk.Err(), "the labelling probe found the session alive")

			// Later probes are the plain check: they leave a name changed after the label.
			require.NoError(t, execOnSession(b.Ctx, lk, `SELECT set_config('application_name', 'renamed after label', false)`))
			testkit.WaitFor(t, wctx, "a later probe runs", func() bool {
				var q string
				require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT query FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&q))
				return strings.HasPrefix(q, "-- name: AdvisorySessionCheck :one\n")
			})
			require.Equal(t, "renamed after label", appOf(t, b, pid), "a later probe labelled the session again")
			require.NoError(t, lk.Err())

			require.NoError(t, lk.Unlock(b.Ctx))
			require.Equal(t, "renamed while held", appOf(t, b, pid), "a labelled lock's unlock puts back the name of the grant")
		})
	}
}

// The labelling probe labels only the backend that took the lock: on a connection that now
// reaches another backend (a pooler between) it reports a *PIDChangedError and leaves that
// backend's application_name as it is. On the lock's own backend it labels and returns nil.
func TestAdvisorySessionLabelOnlyItsBackend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn, pid := testkit.Conn(t, b.Ctx, b.Pool)
	before := appOf(t, b, pid)

	err := advisory.LabelSession(conn, pid+1, "job", advisory.Key{}, time.Minute)
	var changed *advisory.PIDChangedError
	require.ErrorAs(t, err, &changed)
	require.Equal(t, advisory.PIDChangedError{Got: pid, Want: pid + 1}, *changed)
	require.Equal(t, before, appOf(t, b, pid), "another backend was labelled")

	require.NoError(t, advisory.LabelSession(conn, pid, "job", advisory.Key{}, time.Minute))
	require.Equal(t, "fencelock job", appOf(t, b, pid))
	_, err = conn.Exec(b.Ctx, `SELECT set_config('application_name', $1, false)`, before)
	require.NoError(t, err)
}
