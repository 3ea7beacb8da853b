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
	bin := filepath.Join(t.TempDir(), "cron")
	out, err := exec.CommandContext(e.ctx, "go", "build", "-o", bin, "github.com/fencelock/fencelock/examples/cron").CombinedOutput()
	require.NoError(t, err, "%s", out)
	run := exec.CommandContext(e.ctx, bin)
	run.Env = append(os.Environ(), "DATABASE_URL="+e.db.URL, "FENCELOCK_CRON_SECONDS=4")
	run.Cancel = func() error { return run.Process.Signal(syscall.SIGTERM) } // it stops its replicas
	run.WaitDelay = 10 * time.Second
	out, err = run.CombinedOutput()
	require.NoError(t, err, "%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	m := regexp.MustCompile(`^cron: slots=(\d+) runs=(\d+) duplicate_runs=0 missed_slots=(\d+)$`).FindStringSubmatch(last)
	require.NotNil(t, m, "last line: %s\n%s", last, out)
	slots, _ := strconv.Atoi(m[1])
	runs, _ := strconv.Atoi(m[2])
	require.GreaterOrEqual(t, slots, 15, "4 s of 200 ms slots")
	require.Positive(t, runs)
	t.Logf("chaos: scenario=13-cron-replicas-killed %s", last)
}
