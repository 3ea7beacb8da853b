package timing_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/timing"
	"github.com/fencelock/fencelock/internal/timing/timingtest"
)

// The loop idiom, on a manual clock (its timers run inside advance, so every round here runs
// synchronously): a round runs at the time asked, the next at the time the step returned, an
// earlier request moves it, a later one does not; a round asked for while one runs follows it;
// stopping, by the owner or by a step that finds nothing held, leaves no round armed, and the
// loop can be armed again.
func TestLoopOnManualClock(t *testing.T) {
	clk := timingtest.NewManualClock()
	t0 := clk.Now()
	var mu sync.Mutex // the owner's
	held := true
	var steps []time.Duration // when each round ran, since t0
	var during func()         // runs inside the next step, as a grant added meanwhile would
	var lp *timing.Loop
	lp = timing.NewLoop(clk, func(now time.Time) (time.Time, bool) {
		if f := during; f != nil {
			during = nil
			f()
		}
		mu.Lock()
		defer mu.Unlock()
		if !held {
			lp.StopLocked()
			return now, false
		}
		steps = append(steps, now.Sub(t0))
		return now.Add(time.Second), true
	})
	start := func(at time.Duration) {
		mu.Lock()
		require.True(t, lp.StartLocked())
		require.False(t, lp.StartLocked(), "a running loop is not started twice")
		mu.Unlock()
		lp.WakeAt(t0.Add(at))
	}
	ms := time.Millisecond

	start(time.Second)
	clk.Advance(999 * ms)
	require.Empty(t, steps, "a round ran before its time")
	clk.Advance(ms)
	require.Equal(t, []time.Duration{time.Second}, steps)
	clk.Advance(time.Second)
	require.Equal(t, []time.Duration{time.Second, 2 * time.Second}, steps, "the next round runs when the step asked")

	lp.WakeAt(t0.Add(2100 * ms)) // earlier than the armed 3 s
	lp.WakeAt(t0.Add(2900 * ms)) // later than that: no change
	clk.Advance(200 * ms)
	require.Equal(t, 2100*ms, steps[2], "an earlier round asked for moved the next one")

	during = func() { lp.WakeAt(clk.Now()) } // asked for while a round runs
	clk.Advance(time.Second)
	require.Equal(t, []time.Duration{3100 * ms, 3100 * ms}, steps[3:], "a round asked for during a round runs right after it")

	mu.Lock()
	held = false
	lp.StopLocked() // the owner's last grant ended
	mu.Unlock()
	require.False(t, armed(lp), "a stopped loop left its timer armed")
	clk.Advance(10 * time.Second)
	require.Len(t, steps, 5, "a stopped loop ran a round")

	held = true
	start(14 * time.Second)
	clk.Advance(time.Second)
	require.Len(t, steps, 6, "a loop armed again runs")
	mu.Lock()
	held = false // the next step finds nothing held and stops the loop itself
	mu.Unlock()
	clk.Advance(time.Second)
	clk.Advance(10 * time.Second)
	require.Len(t, steps, 6)
	mu.Lock()
	require.False(t, lp.RunningLocked())
	mu.Unlock()
	require.False(t, armed(lp), "a loop stopped by its step left its timer armed")
}

// The loop on the system clock under concurrent grants and ends: rounds never overlap, a
// stopped loop is armed again by the next grant, and a grant held at the end gets its round.
func TestLoopConcurrentStartStop(t *testing.T) {
	var mu sync.Mutex // the owner's
	held := 0
	var inRound atomic.Int32
	rounds := make(chan struct{}, 1)
	var lp *timing.Loop
	lp = timing.NewLoop(timing.System{}, func(now time.Time) (time.Time, bool) {
		if inRound.Add(1) != 1 {
			t.Error("two rounds ran at once")
		}
		defer inRound.Add(-1)
		mu.Lock()
		defer mu.Unlock()
		if held == 0 {
			lp.StopLocked()
			return now, false
		}
		select {
		case rounds <- struct{}{}:
		default:
		}
		return now.Add(time.Millisecond), true
	})
	grant := func() {
		mu.Lock()
		held++
		start := lp.StartLocked()
		mu.Unlock()
		if start {
			lp.WakeAt(time.Now())
		}
	}
	end := func() {
		mu.Lock()
		defer mu.Unlock()
		if held--; held == 0 {
			lp.StopLocked()
		}
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 2000 {
				grant()
				end()
			}
		})
	}
	wg.Wait()
	mu.Lock()
	require.Zero(t, held)
	mu.Unlock()
	for len(rounds) > 0 {
		<-rounds
	}
	grant()
	select {
	case <-rounds:
	case <-time.After(5 * time.Second):
		t.Fatal("a grant held after the churn got no round")
	}
	end()
}

// armed reports whether lp has a round armed.
func armed(lp *timing.Loop) bool {
	_, ok := lp.Armed()
	return ok
}
