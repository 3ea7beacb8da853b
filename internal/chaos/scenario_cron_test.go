package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Scenario 13: examples/cron, run as a user would: five replica processes run a job on 200 ms
// slots; every 300 ms one of those running the job is killed with SIGKILL wherever it is (never
// the first, steady, replica, which settles every slot the others leave) and replaced. No slot runs twice, and every missed slot is one whose run
// was killed (the job does not retry crashed slots): the example checks both from the
// database, exits non-zero otherwise, and its last line counts them.
//
// The invariants are the example's; the test asks only for enough of them: it runs the example
// (4 s, then twice as long each time) until its runs have covered cronWantSlots slots in all,
// with at least one kill, or fails when cronDeadline passes first. Its replicas are processes
// that start and connect while others are killed, which on a loaded machine eats much of a 4 s
// run; how many slots a run covers is the machine's speed, not the job's correctness. A run in
// which no replica was killed (none but the steady one ever ran the job) judges nothing of the
// kills: its slots are not counted.
func TestScenarioCronReplicasKilled(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "cron") // before setup: the build is no part of the scenario's time
	e := setup(t, setupOpts{scenario: "13-cron-replicas-killed", timeout: cronDeadline + time.Minute})
	line := regexp.MustCompile(`^cron: slots=(\d+) runs=(\d+) duplicate_runs=0 missed_slots=(\d+)$`)
	start := time.Now()
	slots, runs, missed, kills := 0, 0, 0, 0
	killedLine := regexp.MustCompile(`(?m)^killed (\d+) replicas with SIGKILL`)
	for n, seconds := 1, 4; slots < cronWantSlots; n, seconds = n+1, min(2*seconds, 32) {
		require.Less(t, time.Since(start), cronDeadline,
			"too few slots to say anything: %d in %d runs of the example in %v (want %d); the invariants held in every run", slots, n-1, time.Since(start).Round(time.Second), cronWantSlots)
		out, last, err := runBuilt(t, bin, e.db.URL, fmt.Sprintf("FENCELOCK_CRON_SECONDS=%d", seconds))
		if err != nil && nothingRan(out) {
			// Its replicas never got to run a slot in the time given (they start and connect
			// while others are killed): a run too short for this machine, not a broken
			// invariant. The next run is longer.
			t.Logf("run %d (%d s): no slot ran; trying a longer run", n, seconds)
			continue
		}
		require.NoError(t, err, "the example found a broken invariant (or failed); its output:\n%s", out)
		m := line.FindStringSubmatch(last)
		require.NotNil(t, m, "last line: %s\n%s", last, out)
		s, _ := strconv.Atoi(m[1])
		r, _ := strconv.Atoi(m[2])
		ms, _ := strconv.Atoi(m[3])
		require.Positive(t, r, "a run that exited 0 ran something")
		k := killedLine.FindSubmatch(out)
		require.NotNil(t, k, "no line counting the kills:\n%s", out)
		killed, _ := strconv.Atoi(string(k[1]))
		if killed == 0 {
			t.Logf("run %d (%d s): no replica was killed (%s): not counted; trying a longer run", n, seconds, last)
			continue
		}
		slots, runs, missed, kills = slots+s, runs+r, missed+ms, kills+killed
		t.Logf("run %d (%d s): %s", n, seconds, last)
	}
	t.Logf("chaos: scenario=13-cron-replicas-killed slots=%d runs=%d duplicate_runs=0 missed_slots=%d (all explained by kills) kills=%d in %v",
		slots, runs, missed, kills, time.Since(start).Round(time.Millisecond))
}

const (
	// cronWantSlots is how many slots the example's runs must cover, in all, for the scenario
	// to say anything: 15 of the 20 a quiet machine covers in one 4 s run.
	cronWantSlots = 15
	// cronDeadline bounds the runs of the example; a quiet machine needs one (about 10 s).
	cronDeadline = 3 * time.Minute
)

// nothingRan reports whether the cron example's output says it failed only because no slot
// ran at all (its one FAIL line is "nothing ran").
func nothingRan(out []byte) bool {
	var fails []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "cron: FAIL") {
			fails = append(fails, l)
		}
	}
	return len(fails) == 1 && fails[0] == "cron: FAIL: nothing ran"
}

// runExample builds examples/<name> and runs it once as a user would (see runBuilt), on e's
// database with env added to the environment, and returns its output and last line; the test
// fails if it exits non-zero.
func runExample(t *testing.T, e *env, name string, env ...string) (out []byte, last string) {
	t.Helper()
	out, last, err := runBuilt(t, buildExample(t, name), e.db.URL, env...)
	require.NoError(t, err, "%s", out)
	return out, last
}

// buildExample builds examples/<name> (without -race) into the test's temporary directory and
// returns the binary's path. The build is bounded by the test binary's own deadline (-timeout)
// rather than a scenario's: from a cold build cache it compiles some 400 packages, minutes on a
// loaded 2-core machine (2m22s measured at a load average of 9).
func buildExample(t *testing.T, name string) string {
	t.Helper()
	ctx := t.Context()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-30*time.Second))
		defer cancel()
	}
	bin := filepath.Join(t.TempDir(), name)
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/fencelock/fencelock/examples/"+name).CombinedOutput()
	require.NoError(t, err, "build examples/%s: %s", name, out)
	return bin
}

// exampleRunTimeout bounds one run of an example, from its start: the examples bound their own
// run at two minutes.
const exampleRunTimeout = 3 * time.Minute

// runBuilt runs the example bin as a user would, on the database at url with env added to the
// environment, and returns its output, its last line, and its exit error (nil when it exited
// 0). Past exampleRunTimeout, or at the test's end, it gets SIGTERM, on which an example stops
// its child processes (SIGKILL 15 s later).
func runBuilt(t *testing.T, bin, url string, env ...string) (out []byte, last string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), exampleRunTimeout)
	defer cancel()
	run := exec.CommandContext(ctx, bin)
	run.Env = append(append(os.Environ(), "DATABASE_URL="+url), env...)
	run.Cancel = func() error { return run.Process.Signal(syscall.SIGTERM) }
	run.WaitDelay = 15 * time.Second
	out, err = run.CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return out, lines[len(lines)-1], err
}
