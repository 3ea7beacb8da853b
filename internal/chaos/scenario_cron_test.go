package chaos

import (
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
// slots for 4 s (20 slots), one killed with SIGKILL every 300 ms wherever it is and replaced.
// No slot runs twice, and every missed slot is one whose run was killed (the job does not
// retry crashed slots): the example checks both from the database, exits non-zero otherwise,
// and its last line counts them.
func TestScenarioCronReplicasKilled(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{scenario: "13-cron-replicas-killed"})
	out, last := runExample(t, e, "cron", "FENCELOCK_CRON_SECONDS=4")
	m := regexp.MustCompile(`^cron: slots=(\d+) runs=(\d+) duplicate_runs=0 missed_slots=(\d+)$`).FindStringSubmatch(last)
	require.NotNil(t, m, "last line: %s\n%s", last, out)
	slots, _ := strconv.Atoi(m[1])
	runs, _ := strconv.Atoi(m[2])
	require.GreaterOrEqual(t, slots, 15, "4 s of 200 ms slots")
	require.Positive(t, runs)
	t.Logf("chaos: scenario=13-cron-replicas-killed %s", last)
}

// runExample builds examples/<name> and runs it as a user would, on e's database with env
// added to the environment, and returns its output and last line; the test fails if it exits
// non-zero. The test's end sends it SIGTERM, on which an example stops its child processes.
func runExample(t *testing.T, e *env, name string, env ...string) (out []byte, last string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	out, err := exec.CommandContext(e.ctx, "go", "build", "-o", bin, "github.com/fencelock/fencelock/examples/"+name).CombinedOutput()
	require.NoError(t, err, "%s", out)
	run := exec.CommandContext(e.ctx, bin)
	run.Env = append(append(os.Environ(), "DATABASE_URL="+e.db.URL), env...)
	run.Cancel = func() error { return run.Process.Signal(syscall.SIGTERM) }
	run.WaitDelay = 15 * time.Second
	out, err = run.CombinedOutput()
	require.NoError(t, err, "%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return out, lines[len(lines)-1]
}
