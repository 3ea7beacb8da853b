package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/pgtest"
)

// failoverCluster is a replicated cluster of scenario 10, its database ready (the register
// set up and replicated), and the fault to inject.
type failoverCluster struct {
	pool   *pgxpool.Pool // the database through a multi-host URL: follows the primary
	direct *pgxpool.Pool // the database on the current primary alone, for the paused holder
	sync   bool          // synchronous replication, or a planned switchover: nothing acknowledged may be lost
	lag    time.Duration // how long replication is paused before the fault (0: not paused)
	// pause stops replication for the lag modes.
	pause func(ctx context.Context) error
	// failover injects the fault and returns once a new primary accepts writes, with the
	// wall-clock times of the fault and of the promotion.
	failover func(ctx context.Context) (fault, promoted time.Time, err error)
}

// pairCluster is a primary and a streaming standby from pgtest; the fault is the primary's
// crash (immediate shutdown) and the standby's promotion.
func pairCluster(t *testing.T, ctx context.Context, syncRep bool, lag time.Duration) *failoverCluster {
	primary := pgtest.NewServer(t, pgtest.Crashable())
	db := primary.NewDB(t)
	require.NoError(t, SetupRegister(ctx, db.Pool, registerNames...))
	standby := primary.NewStandby(t)
	if syncRep {
		require.NoError(t, primary.SetSynchronousStandbys(ctx, "*"))
	}
	url, err := pgtest.ClusterURL(db.Name, primary, standby)
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, url+"&pool_max_conns=16")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &failoverCluster{
		pool: pool, direct: db.Pool, sync: syncRep, lag: lag,
		pause: func(ctx context.Context) error {
			_, err := primary.PauseWALSenders(ctx)
			return err
		},
		failover: func(ctx context.Context) (time.Time, time.Time, error) {
			fault := time.Now()
			if err := primary.Crash(ctx); err != nil {
				return fault, time.Time{}, err
			}
			crashed := time.Now()
			// The promoted server runs alone, asynchronously: the standby was made before the
			// primary set synchronous_standby_names (ALTER SYSTEM writes a file, not WAL).
			err := standby.Promote(ctx)
			promoted := time.Now()
			t.Logf("crash %v, promotion %v", crashed.Sub(fault), promoted.Sub(crashed))
			return fault, promoted, err
		},
	}
}

// patroniCluster is a two-node Patroni cluster; the fault is a switchover or the leader's
// kill.
func patroniCluster(t *testing.T, ctx context.Context, mode string) *failoverCluster {
	c := pgtest.NewPatroni(t, 2)
	db := c.NewDB(t)
	require.NoError(t, SetupRegister(ctx, db.Pool, registerNames...))
	require.NoError(t, c.WaitReplay(ctx))
	leader, err := c.Leader(ctx)
	require.NoError(t, err)
	leaderURL, err := c.NodeURL(leader, db.Name)
	require.NoError(t, err)
	direct, err := pgxpool.New(ctx, leaderURL)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	pool, err := pgxpool.New(ctx, db.URL+"&pool_max_conns=16")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &failoverCluster{
		// A switchover shuts the leader down cleanly: its replica has all its WAL before it is
		// promoted, so nothing acknowledged may be lost, as with synchronous replication.
		pool: pool, direct: direct, sync: mode == "switchover",
		failover: func(ctx context.Context) (time.Time, time.Time, error) {
			var change pgtest.LeaderChange
			var err error
			fault := time.Now()
			if mode == "switchover" {
				change, err = c.Switchover(ctx, "")
			} else {
				change, err = c.KillLeader(ctx)
			}
			t.Logf("patroni %s: %s -> %s, timeline %d, %v", mode, change.From, change.To, change.Timeline, change.Elapsed)
			return fault, fault.Add(change.Elapsed), err
		},
	}
}
