package ratelimit

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
)

// These tests need no server. The server tests of the limiter (bursts, retries, sweeps, the
// bound under concurrency) are in limiter_test.go (package ratelimit_test).

// unreachablePool is a pool whose every connection attempt fails: pgxpool connects lazily, so a
// call that returns an *ArgumentError through it provably ran no SQL.
var unreachablePool = testkit.UnreachablePool

// requireArgError checks that err is bad input for arg, and that it matches package
// fencelock's names as well as this package's.
func requireArgError(t *testing.T, err error, arg string) {
	t.Helper()
	var ae *ArgumentError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, arg, ae.Arg)
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	var fae *fencelock.ArgumentError
	require.ErrorAs(t, err, &fae)
}

func TestPerSecondAndPerMinute(t *testing.T) {
	t.Parallel()
	require.Equal(t, Limit{Rate: 10, Per: time.Second, Burst: 10}, PerSecond(10))
	require.Equal(t, Limit{Rate: 30, Per: time.Minute, Burst: 30}, PerMinute(30))
}

// The interval between requests at the steady rate is Per/Rate rounded up to a whole
// microsecond, so the rate enforced is never above Rate/Per.
func TestLimitEmission(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		desc  string
		limit Limit
		want  time.Duration
	}{
		{"Exact", Limit{Rate: 10, Per: time.Second, Burst: 1}, 100 * time.Millisecond},
		{"RoundedUpToMicrosecond", Limit{Rate: 3, Per: time.Second, Burst: 1}, 333334 * time.Microsecond},
		{"AMillionASecond", Limit{Rate: 1_000_000, Per: time.Second, Burst: 1}, time.Microsecond},
		{"FasterThanAMicrosecondIsOne", Limit{Rate: 7, Per: time.Microsecond, Burst: 1}, time.Microsecond},
		{"HugeRateNoOverflow", Limit{Rate: math.MaxInt64, Per: time.Second, Burst: 1}, time.Microsecond},
		{"MaxTTL", Limit{Rate: 1, Per: fencelock.MaxTTL, Burst: 1}, fencelock.MaxTTL},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			require.NoError(t, tc.limit.check())
			require.Equal(t, tc.want, tc.limit.emission())
		})
	}
}

// A limit that New refuses names the field at fault; the extremes that are valid pass.
func TestLimitCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		desc  string
		limit Limit
		arg   string
	}{
		{"Zero", Limit{}, "limit.Rate"},
		{"NegativeRate", Limit{Rate: -1, Per: time.Second, Burst: 1}, "limit.Rate"},
		{"ZeroPer", Limit{Rate: 1, Per: 0, Burst: 1}, "limit.Per"},
		{"PerUnderAMicrosecond", Limit{Rate: 1, Per: time.Microsecond - 1, Burst: 1}, "limit.Per"},
		{"ZeroBurst", Limit{Rate: 1, Per: time.Second, Burst: 0}, "limit.Burst"},
		{"BurstOverMax", Limit{Rate: 1, Per: time.Second, Burst: MaxBurst + 1}, "limit.Burst"},
		{"IntervalOverMaxTTL", Limit{Rate: 1, Per: 30 * 24 * time.Hour, Burst: 1}, "limit"},
		{"HugePer", Limit{Rate: 1, Per: math.MaxInt64, Burst: 1}, "limit"},
		{"RefillOverMaxTTL", Limit{Rate: 1, Per: fencelock.MaxTTL, Burst: 2}, "limit"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			requireArgError(t, tc.limit.check(), tc.arg)
			_, err := New(unreachablePool(t), tc.limit)
			requireArgError(t, err, tc.arg)
		})
	}
	for _, lim := range []Limit{
		{Rate: 1, Per: time.Microsecond, Burst: 1},
		{Rate: 1000, Per: time.Second, Burst: MaxBurst},
		{Rate: math.MaxInt64, Per: time.Second, Burst: 1},
		{Rate: 1, Per: fencelock.MaxTTL, Burst: 1}, // refills in exactly MaxTTL
	} {
		r, err := New(unreachablePool(t), lim)
		require.NoError(t, err, "%+v", lim)
		require.Equal(t, lim, r.Limit())
	}
}

// Bad input is refused before any SQL: through a pool that cannot connect, the error is the
// ArgumentError, not a connection error.
func TestBadInputIsRefusedBeforeSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := unreachablePool(t)
	_, err := New(nil, PerSecond(1))
	requireArgError(t, err, "pool")
	_, err = New(pool, PerSecond(1), WithDurableDecisions(), nil)
	requireArgError(t, err, "opts[1]")
	r, err := New(pool, PerSecond(5))
	require.NoError(t, err)
	for _, n := range []int{0, -1, 6} {
		_, err = r.AllowN(ctx, "k", n)
		requireArgError(t, err, "n")
		_, err = r.Wait(ctx, "k", n)
		requireArgError(t, err, "n")
	}
	for _, key := range []string{"", "a\x00b", "a\xffb", strings.Repeat("k", fencelock.MaxNameLength+1)} {
		_, err = r.Allow(ctx, key)
		requireArgError(t, err, "key")
		requireArgError(t, r.Reset(ctx, key), "key")
	}
	_, err = Sweep(ctx, nil, time.Second)
	requireArgError(t, err, "pool")
	_, err = Sweep(ctx, pool, -time.Second)
	requireArgError(t, err, "idle")
}

// WithDurableDecisions sets the limiter's commit mode and nothing else; the default is
// asynchronous. The precomputed intervals of a request of cost 1 are its cost and its cost
// less the tolerance.
func TestNewOptions(t *testing.T) {
	t.Parallel()
	pool := unreachablePool(t)
	lim := Limit{Rate: 10, Per: time.Second, Burst: 3}
	fast, err := New(pool, lim)
	require.NoError(t, err)
	require.False(t, fast.durable)
	durable, err := New(pool, lim, WithDurableDecisions())
	require.NoError(t, err)
	require.True(t, durable.durable)
	require.Equal(t, lim, durable.Limit())
	require.Equal(t, micros(100*time.Millisecond), fast.cost1)
	require.Equal(t, micros(-200*time.Millisecond), fast.slack1)
}

// This package's errors are package fencelock's values, so a caller matches either name.
func TestErrorsAreFencelocksErrors(t *testing.T) {
	t.Parallel()
	require.True(t, ErrInvalidArgument == fencelock.ErrInvalidArgument)
	require.True(t, ErrReadOnly == fencelock.ErrReadOnly)
}
