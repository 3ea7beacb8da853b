package fencelock

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// The accessors that packages built on a lessor use (job, gooselock): Pool is the lessor's
// pool, Backoff its backoff, and CheckTTL refuses exactly the TTLs an acquire refuses, with
// the same ArgumentError, before any SQL (the pool cannot connect).
func TestLessorAccessors(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://fencelock@127.0.0.1:1/none?connect_timeout=1")
	require.NoError(t, err)
	defer pool.Close()
	backoff := func(int) time.Duration { return 42 * time.Millisecond }
	l, err := NewLessor(pool, WithBackoff(backoff), WithHeartbeatInterval(5*time.Second), WithHolder("worker-7"))
	require.NoError(t, err)
	require.Same(t, pool, l.Pool())
	require.Equal(t, "worker-7", l.Holder())
	require.Equal(t, 42*time.Millisecond, l.Backoff()(3))
	def, err := NewLessor(pool)
	require.NoError(t, err)
	require.NotNil(t, def.Backoff())

	require.NoError(t, l.CheckTTL(10*time.Second))
	for _, tc := range []struct {
		desc string
		ttl  time.Duration
		arg  string
	}{
		{"Zero", 0, "ttl"},
		{"UnderMin", MinTTL - time.Nanosecond, "ttl"},
		{"OverMax", MaxTTL + time.Nanosecond, "ttl"},
		{"NoRoomForHeartbeat", 5 * time.Second, "WithHeartbeatInterval"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			err := l.CheckTTL(tc.ttl)
			_, acqErr := l.TryAcquire(context.Background(), "name", tc.ttl)
			require.Equal(t, acqErr, err, "CheckTTL and the acquire disagree")
			var ae *ArgumentError
			require.ErrorAs(t, err, &ae)
			require.Equal(t, tc.arg, ae.Arg)
		})
	}
}
