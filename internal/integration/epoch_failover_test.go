package integration

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/pgtest"
)

// After a promotion, every token on every path is larger than every token the old primary
// issued, even when the promotion lost the last sequence increments. The standby lags (its
// WAL sender is paused) while each path issues more tokens than nextval logs ahead (32), so
// the promoted server's sequence is behind: its plain sequence values repeat those of the old
// primary (checked, as a control), and only the epoch keeps tokens rising. With a synchronous
// standby nothing is lost, and even the sequence values rise.
func TestTokensRiseAcrossFailover(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"async-lagged", "sync"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			primary, db, standby := crashableStandbyPair(t)
			url, err := pgtest.ClusterURL(db.Name, primary, standby)
			require.NoError(t, err)
			pool := newPool(t, ctx, url+"&pool_max_conns=64") // each advisory session lock keeps a connection
			if mode == "sync" {
				require.NoError(t, primary.SetSynchronousStandbys(ctx, "*"))
			} else {
				// A rebase on the standby is refused as read-only, before anything.
				_, err := fencelock.RebaseTokenEpoch(ctx, newPool(t, ctx, standby.URL(db.Name)), 0)
				require.ErrorIs(t, err, fencelock.ErrReadOnly)
			}

			var old []fencelock.Token
			issue := func(round, n int) {
				for _, tc := range fencetest.TokenPaths {
					for i := range n {
						token, err := tc.Issue(t, ctx, pool, round*1000+i)
						require.NoError(t, err, tc.Desc)
						old = append(old, token)
					}
				}
			}
			issue(0, 5)
			if mode == "async-lagged" {
				require.NoError(t, primary.WaitReplay(ctx, standby))
				_, err := primary.PauseWALSenders(ctx)
				require.NoError(t, err)
			}
			issue(1, 40)
			maxOld := fencelock.Token(0)
			for _, tok := range old {
				maxOld = max(maxOld, tok)
			}

			require.NoError(t, primary.Crash(ctx))
			require.NoError(t, standby.Promote(ctx))
			pool.Reset()
			awaitReconnect(t, ctx, pool)
			for _, tc := range fencetest.TokenPaths {
				token, err := tc.Issue(t, ctx, pool, 2000)
				require.NoError(t, err, tc.Desc)
				require.Greater(t, token, maxOld, "%s: a token after the promotion is not above the old primary's", tc.Desc)
				require.Equal(t, maxOld.Epoch()+1, token.Epoch(), tc.Desc)
				if mode == "async-lagged" {
					require.Less(t, token.Sequence(), maxOld.Sequence(), "%s: control: the promotion lost sequence increments", tc.Desc)
				} else {
					require.Greater(t, token.Sequence(), maxOld.Sequence(), "%s: a synchronous standby loses no increment", tc.Desc)
				}
			}
		})
	}
}

// A logical copy (as pg_dump and restore make it) onto a server on an earlier timeline hands
// out smaller tokens until RebaseTokenEpoch; after it, every token is above the source's.
func TestRebaseTokenEpochAfterLogicalCopy(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The source: a database on timeline 2, after a promotion.
	primary, src, standby := crashableStandbyPair(t)
	require.NoError(t, primary.Crash(ctx))
	require.NoError(t, standby.Promote(ctx))
	srcPool := newPool(t, ctx, standby.URL(src.Name))
	lease, err := newLessor(t, srcPool, "src").TryAcquire(ctx, "copied", time.Minute)
	require.NoError(t, err)
	require.EqualValues(t, 2, lease.Token().Epoch())
	require.NoError(t, fenceOnly(ctx, srcPool, "copied", lease.Token()))
	require.NoError(t, lease.Release(ctx))

	// The copy, on a fresh server's timeline 1: fencelock's rows and the sequence, as pg_dump
	// carries them.
	dst := setup(t)
	var leases, fences [][]any
	var seq int64
	collect := func(q string) [][]any {
		rows, err := srcPool.Query(ctx, q)
		require.NoError(t, err)
		var out [][]any
		for rows.Next() {
			v, err := rows.Values()
			require.NoError(t, err)
			out = append(out, v)
		}
		require.NoError(t, rows.Err())
		return out
	}
	leases = collect(`SELECT name, holder, token, acquired_at, expires_at FROM fencelock.leases`)
	fences = collect(`SELECT resource, token FROM fencelock.fences`)
	require.NoError(t, srcPool.QueryRow(ctx, `SELECT last_value FROM fencelock.leases_token_seq`).Scan(&seq))
	for _, r := range leases {
		_, err := dst.Pool.Exec(ctx, `INSERT INTO fencelock.leases (name, holder, token, acquired_at, expires_at) VALUES ($1, $2, $3, $4, $5)`, r...)
		require.NoError(t, err)
	}
	for _, r := range fences {
		_, err := dst.Pool.Exec(ctx, `INSERT INTO fencelock.fences (resource, token) VALUES ($1, $2)`, r...)
		require.NoError(t, err)
	}
	_, err = dst.Pool.Exec(ctx, `SELECT setval('fencelock.leases_token_seq', $1)`, seq)
	require.NoError(t, err)
	var lastEpoch int32
	require.NoError(t, srcPool.QueryRow(ctx, `SELECT last_epoch FROM fencelock.token_epoch`).Scan(&lastEpoch))
	require.EqualValues(t, 2, lastEpoch, "the source recorded the epoch it issued tokens in")

	// A copy without fencelock.token_epoch's row cannot know: its tokens are smaller.
	l := newLessor(t, dst.Pool, "dst")
	before, err := l.TryAcquire(ctx, "control", time.Minute)
	require.NoError(t, err)
	require.Less(t, before.Token(), lease.Token(), "control: without the row and before the rebase, the copy's tokens are below the source's")
	require.NoError(t, before.Release(ctx))

	// With it, as pg_dump carries it, every grant is refused until the rebase.
	_, err = dst.Pool.Exec(ctx, `UPDATE fencelock.token_epoch SET last_epoch = $1`, lastEpoch)
	require.NoError(t, err)
	for i, tc := range fencetest.TokenPaths {
		_, err := tc.Issue(t, ctx, dst.Pool, 100+i)
		require.ErrorIs(t, err, fencelock.ErrTokenEpochBehind, tc.Desc)
	}
	requireNothingHeld(t, ctx, dst.Pool, "control")

	epoch, err := fencelock.RebaseTokenEpoch(ctx, dst.Pool, 0)
	require.NoError(t, err)
	require.EqualValues(t, 3, epoch, "above the source's epoch 2")
	after, err := l.TryAcquire(ctx, "copied", time.Minute)
	require.NoError(t, err)
	require.Greater(t, after.Token(), lease.Token())
	require.Equal(t, epoch, after.Token().Epoch())
	require.NoError(t, fenceOnly(ctx, dst.Pool, "copied", after.Token()), "the new holder passes the copied fence")

	epoch, err = fencelock.RebaseTokenEpoch(ctx, dst.Pool, 10)
	require.NoError(t, err)
	require.EqualValues(t, 10, epoch)
	epoch, err = fencelock.RebaseTokenEpoch(ctx, dst.Pool, 0)
	require.NoError(t, err)
	require.EqualValues(t, 10, epoch, "a rebase never lowers the epoch")

	_, err = fencelock.RebaseTokenEpoch(ctx, nil, 0)
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	_, err = fencelock.RebaseTokenEpoch(ctx, dst.Pool, 65536)
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	epoch, err = fencelock.RebaseTokenEpoch(ctx, dst.Pool, 65535)
	require.NoError(t, err)
	require.EqualValues(t, 65535, epoch)
	last, err := l.TryAcquire(ctx, "last-epoch", time.Minute)
	require.NoError(t, err)
	require.Positive(t, last.Token())
	require.EqualValues(t, 65535, last.Token().Epoch())
}

// A second promotion: primary A with standbys B and C; A dies and B is promoted (timeline 2)
// and grants; B dies before C follows it, and C is promoted. With a WAL archive the three
// share, C finds B's timeline history there and takes timeline 3: its tokens are above B's.
// Without one (the control), C takes timeline 2 again and its tokens fall below B's: the
// hazard docs/FAILOVER.md describes, which epoch tokens cannot see.
func TestTokensRiseAcrossSecondPromotion(t *testing.T) {
	t.Parallel()
	for _, shared := range []bool{true, false} {
		t.Run(map[bool]string{true: "SharedArchive", false: "ControlNoArchive"}[shared], func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var opts []pgtest.Option
			if shared {
				opts = append(opts, pgtest.WALArchive())
			}
			a, db, b := crashableStandbyPair(t, opts...)
			c := a.NewStandby(t)
			require.NoError(t, a.Crash(ctx))
			require.NoError(t, b.Promote(ctx))
			bpool := newPool(t, ctx, b.URL(db.Name))
			var top fencelock.Token
			for i := range 50 {
				token, err := fencetest.LeaseGrantToken(t, ctx, bpool, i)
				require.NoError(t, err)
				top = max(top, token)
			}
			require.EqualValues(t, 2, top.Epoch())
			if shared {
				history := filepath.Join(b.WALArchive(), "00000002.history")
				require.Eventually(t, func() bool {
					_, err := os.Stat(history)
					return err == nil
				}, 30*time.Second, 10*time.Millisecond, "B archives its timeline history")
			}
			require.NoError(t, b.Crash(ctx))
			require.NoError(t, c.Promote(ctx))
			cpool := newPool(t, ctx, c.URL(db.Name))
			token, err := fencetest.LeaseGrantToken(t, ctx, cpool, 100)
			require.NoError(t, err)
			if shared {
				require.EqualValues(t, 3, token.Epoch())
				require.Greater(t, token, top)
			} else {
				require.EqualValues(t, 2, token.Epoch(), "control: C reuses timeline 2")
				require.Less(t, token, top, "control: C's tokens fall below B's")
			}
		})
	}
}
