package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// examples/cron, run as a user would (its replicas are child processes, killed with SIGKILL at
// random): no slot runs twice, and every missed slot is one whose run was killed (the example
// checks that and exits non-zero otherwise); its last line counts from the database.
func TestExampleCron(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bin := filepath.Join(t.TempDir(), "cron")
	build := exec.CommandContext(b.ctx, "go", "build", "-o", bin, "github.com/fencelock/fencelock/examples/cron")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	run := exec.CommandContext(b.ctx, bin)
	run.Env = append(os.Environ(), "DATABASE_URL="+b.db.URL, "FENCELOCK_CRON_SECONDS=3")
	out, err = run.CombinedOutput()
	require.NoError(t, err, "%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	m := regexp.MustCompile(`^cron: slots=(\d+) runs=(\d+) duplicate_runs=0 missed_slots=(\d+)$`).FindStringSubmatch(last)
	require.NotNil(t, m, "last line: %s\n%s", last, out)
	slots, _ := strconv.Atoi(m[1])
	runs, _ := strconv.Atoi(m[2])
	require.GreaterOrEqual(t, slots, 10, "3 s of 200 ms slots")
	require.Greater(t, runs, 0)
	t.Log(last)
}
