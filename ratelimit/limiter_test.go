package ratelimit_test

import (
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/ratelimit"
)

// A burst is allowed at once, the next request is refused with the time until it would be
// allowed, and after that time it is allowed; costs count n times; Reset gives a full bucket.
func TestRateLimitBurstAndRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := ratelimit.New(b.Pool, ratelimit.Limit{Rate: 10, Per: time.Second, Burst: 3})
	require.NoError(t, err)
	// The burst and the refusal, judged by the decisions' own times (the database clock): the
	// next request is due 100 ms after the first. A machine so loaded that the four decisions
	// span 100 ms or more refills the bucket meanwhile: that attempt says so and runs again on
	// a fresh key.
	var res ratelimit.Result
	var key string
	var first time.Time
	for attempt := 1; ; attempt++ {
		key = fmt.Sprintf("rl:burst:%d", attempt)
		for i := range 3 {
			res, err := r.Allow(b.Ctx, key)
			require.NoError(t, err)
			require.Equal(t, 1, res.Allowed, "request %d of the burst", i)
			require.Equal(t, 2-i, res.Remaining)
			require.Zero(t, res.RetryAfter)
			if i == 0 {
				first = res.At
			}
		}
		res, err = r.Allow(b.Ctx, key)
		require.NoError(t, err)
		if res.At.Sub(first) >= 100*time.Millisecond {
			require.Less(t, attempt, 5, "the four decisions spanned 100 ms or more in 5 attempts")
			t.Logf("attempt %d: the four decisions spanned %v; again", attempt, res.At.Sub(first))
			continue
		}
		break
	}
	require.Zero(t, res.Allowed)
	require.Zero(t, res.Remaining)
	require.InDelta(t, float64(100*time.Millisecond-res.At.Sub(first)), float64(res.RetryAfter), float64(time.Millisecond),
		"the next request is due 100 ms after the first")
	got, err := r.Wait(b.Ctx, key, 1)
	require.NoError(t, err)
	require.Equal(t, 1, got.Allowed)
	require.GreaterOrEqual(t, got.At.Sub(res.At), res.RetryAfter-time.Millisecond, "allowed no earlier than said")

	// A cost of 3 needs a full bucket.
	res, err = r.AllowN(b.Ctx, "rl:cost", 3)
	require.NoError(t, err)
	require.Equal(t, 3, res.Allowed)
	spent := res.At
	res, err = r.AllowN(b.Ctx, "rl:cost", 2)
	require.NoError(t, err)
	if since := res.At.Sub(spent); since < 190*time.Millisecond { // else two came back meanwhile
		require.Zero(t, res.Allowed)
		require.InDelta(t, float64(200*time.Millisecond-since), float64(res.RetryAfter), float64(time.Millisecond),
			"two more are due 200 ms after the three were spent")
	}
	require.NoError(t, r.Reset(b.Ctx, "rl:cost"))
	res, err = r.AllowN(b.Ctx, "rl:cost", 3)
	require.NoError(t, err)
	require.Equal(t, 3, res.Allowed)

	// Keys are independent.
	res, err = r.Allow(b.Ctx, "rl:other")
	require.NoError(t, err)
	require.Equal(t, 1, res.Allowed)
}

// Bad input is refused before any SQL: a bad limit, key or cost.
func TestRateLimitBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, lim := range []ratelimit.Limit{{}, {Rate: 1, Per: 0, Burst: 1}, {Rate: 1, Per: time.Second, Burst: 0},
		{Rate: 1, Per: time.Second, Burst: ratelimit.MaxBurst + 1}, {Rate: 1, Per: 30 * 24 * time.Hour, Burst: 1}} {
		_, err := ratelimit.New(b.Pool, lim)
		require.ErrorIs(t, err, fencelock.ErrInvalidArgument, "%+v", lim)
	}
	// Extreme but valid: the interval rounds up to 1 µs (at most 1,000,000 a second); no overflow.
	huge, err := ratelimit.New(b.Pool, ratelimit.Limit{Rate: math.MaxInt64, Per: time.Second, Burst: 1})
	require.NoError(t, err)
	require.NotNil(t, huge)
	_, err = ratelimit.New(b.Pool, ratelimit.Limit{Rate: 1, Per: math.MaxInt64, Burst: 1})
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	_, err = ratelimit.New(b.Pool, ratelimit.Limit{Rate: 1, Per: fencelock.MaxTTL, Burst: 1})
	require.NoError(t, err, "refills in exactly MaxTTL")
	_, err = ratelimit.New(b.Pool, ratelimit.Limit{Rate: 1, Per: fencelock.MaxTTL, Burst: 2})
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument, "refills in twice MaxTTL")
	_, err = ratelimit.New(nil, ratelimit.PerSecond(1))
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	r, err := ratelimit.New(b.Pool, ratelimit.PerSecond(5))
	require.NoError(t, err)
	for _, n := range []int{0, -1, 6} {
		_, err = r.AllowN(b.Ctx, "k", n)
		require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	}
	_, err = r.Allow(b.Ctx, "")
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	_, err = r.Allow(b.Ctx, "a\x00b")
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	_, err = ratelimit.Sweep(b.Ctx, b.Pool, -time.Second)
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	var n int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.rate_limits`).Scan(&n))
	require.Zero(t, n, "no SQL ran")
}

// Keys are created on first use and swept once idle (a full bucket on the database clock) and
// not before; a key used again is not swept.
func TestRateLimitSweep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := ratelimit.New(b.Pool, ratelimit.Limit{Rate: 100, Per: time.Second, Burst: 1})
	require.NoError(t, err)
	for _, k := range []string{"rl:s1", "rl:s2"} {
		_, err := r.Allow(b.Ctx, k)
		require.NoError(t, err)
	}
	n, err := ratelimit.Sweep(b.Ctx, b.Pool, time.Hour)
	require.NoError(t, err)
	require.Zero(t, n, "not idle for an hour")
	waitFor(t, b, "both buckets full again on the database clock", func() bool {
		var idle int
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.rate_limits WHERE tat < clock_timestamp()`).Scan(&idle))
		return idle == 2
	})
	// rl:s2 used again, by a limiter of one request an hour: its bucket stays short for an
	// hour, so the sweep below finds it in use however late it runs (with 100 a second, its
	// bucket was full again 10 ms later, and a loaded machine swept it too).
	hourly, err := ratelimit.New(b.Pool, ratelimit.Limit{Rate: 1, Per: time.Hour, Burst: 1})
	require.NoError(t, err)
	res, err := hourly.Allow(b.Ctx, "rl:s2")
	require.NoError(t, err)
	require.Equal(t, 1, res.Allowed)
	n, err = ratelimit.Sweep(b.Ctx, b.Pool, 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "rl:s1 is idle; rl:s2 was just used")
	rows, err := b.Pool.Query(b.Ctx, `SELECT key FROM fencelock.rate_limits WHERE key LIKE 'rl:s%' ORDER BY key`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"rl:s2"}, left, "the key used again is kept, the idle one swept")
}

// rateWindowsOK checks allowed decision times (sorted) against GCRA's bound: in every window
// [a, b) at most burst + (b-a)/emission requests; it returns the worst excess (<= 0 is fine).
func rateWindowExcess(at []time.Time, burst int, emission time.Duration) (worst float64, n int) {
	worst = -1e9
	for i := range at {
		for j := i; j < len(at); j++ {
			// window [at[i], at[j]] closed holds j-i+1 requests; the half-open window up to just
			// past at[j] has length at[j]-at[i] (+1µs).
			allowed := float64(burst) + float64(at[j].Sub(at[i])+time.Microsecond)/float64(emission)
			if ex := float64(j-i+1) - allowed; ex > worst {
				worst = ex
			}
			n++
		}
	}
	return worst, n
}

// Over a minute (FENCELOCK_RATE_SOAK overrides; at least 10 s) of concurrent callers on 16
// goroutines over 2 keys, no window of the database clock ever allows more than burst + rate x
// its length, and the limiter lets through most of what the limit allows (it is not just
// refusing).
func TestRateLimitNeverExceedsUnderConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := time.Minute
	if v := os.Getenv("FENCELOCK_RATE_SOAK"); v != "" {
		var err error
		d, err = time.ParseDuration(v)
		require.NoError(t, err)
	}
	if testing.Short() {
		d = 10 * time.Second
	}
	lim := ratelimit.Limit{Rate: 40, Per: time.Second, Burst: 5}
	r, err := ratelimit.New(b.Pool, lim)
	require.NoError(t, err)
	keys := []string{"rl:soak:a", "rl:soak:b"}
	var mu sync.Mutex
	allowed := map[string][]time.Time{}
	refused := 0
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for g := range 16 {
		key := keys[g%len(keys)]
		wg.Go(func() {
			for time.Now().Before(deadline) {
				n := 1 + g%2 // costs 1 and 2
				res, err := r.AllowN(b.Ctx, key, n)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if res.Allowed > 0 {
					for range n {
						allowed[key] = append(allowed[key], res.At)
					}
				} else {
					refused++
				}
				mu.Unlock()
				if res.Allowed == 0 {
					time.Sleep(res.RetryAfter)
				}
			}
		})
	}
	wg.Wait()
	e := time.Second / 40
	for _, k := range keys {
		at := allowed[k]
		sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
		worst, windows := rateWindowExcess(at, lim.Burst, e)
		span := at[len(at)-1].Sub(at[0])
		t.Logf("%s: %d allowed over %v (limit %d + %.0f), %d windows checked, worst excess %.3f", k, len(at), span, lim.Burst, span.Seconds()*40, windows, worst)
		require.LessOrEqual(t, worst, 1e-9, "a window of %s allowed more than burst + rate x length", k)
		require.Greater(t, float64(len(at)), 0.5*span.Seconds()*40, "the limiter let through less than half the rate")
	}
	require.Positive(t, refused, "the callers asked for more than the limit")
}

// A request is decided at the time it holds its key's row: under a limit far above what 16
// goroutines can ask of one key (1,000,000 a second, bursts of 1,000: a key's tat moves 1 µs a
// request), no request is ever refused. Deciding at the statement's start (now()) refused those
// that waited for the row, or were descheduled, behind later ones by more than 1 ms.
func TestRateLimitDecidesUnderTheRowLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := ratelimit.New(newPool(t, b.Ctx, b.DB.URL), ratelimit.Limit{Rate: 1_000_000, Per: time.Second, Burst: 1000})
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var refused []ratelimit.Result
	for g := range 16 {
		wg.Go(func() {
			for range 200 {
				res, err := r.Allow(b.Ctx, fmt.Sprint("rl:hot:", g%2))
				if err != nil {
					t.Error(err)
					return
				}
				if res.Allowed == 0 {
					mu.Lock()
					refused = append(refused, res)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	require.Empty(t, refused, "requests refused under a limit they could not reach")
}

// Both commit modes decide the same way, and neither changes the session's synchronous_commit
// (the default sets it off for its own statement's transaction only; a session left with it
// off would commit the application's later statements asynchronously).
func TestRateLimitCommitModes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(b.DB.URL)
	require.NoError(t, err)
	cfg.MaxConns = 1 // every statement below on the same session
	pool, err := pgxpool.NewWithConfig(b.Ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	for _, tc := range []struct {
		desc string
		opts []ratelimit.Option
	}{
		{"Default", nil},
		{"DurableDecisions", []ratelimit.Option{ratelimit.WithDurableDecisions()}},
	} {
		r, err := ratelimit.New(pool, ratelimit.Limit{Rate: 1, Per: time.Hour, Burst: 2}, tc.opts...)
		require.NoError(t, err, tc.desc)
		key := "rl:mode:" + tc.desc
		for i, want := range []int{1, 1, 0} {
			res, err := r.Allow(b.Ctx, key)
			require.NoError(t, err, tc.desc)
			require.Equal(t, want, res.Allowed, "%s: request %d", tc.desc, i)
			var sc string
			require.NoError(t, pool.QueryRow(b.Ctx, `SHOW synchronous_commit`).Scan(&sc))
			require.Equal(t, "on", sc, "%s: the session's synchronous_commit after request %d", tc.desc, i)
		}
	}
}
