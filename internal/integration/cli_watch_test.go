package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/cli"
	"github.com/fencelock/fencelock/pgtest"
)

// watch --json prints one array per refresh, one a line, and ends at a line "q" on stdin.
func TestCLIWatchJSON(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stdinR, stdinW := io.Pipe()
	stdoutR, stdoutW := io.Pipe()
	// Ends watch's reader of stdin; and, should the test fail early, watch itself (its next
	// write fails).
	t.Cleanup(func() { stdinW.Close(); stdoutR.Close() })
	env := func(k string) string { return map[string]string{"DATABASE_URL": b.DB.URL}[k] }
	exited := make(chan int, 1)
	go func() {
		exited <- cli.Run(b.Ctx, []string{"watch", "--json", "--interval", "20ms"}, env, stdinR, stdoutW, io.Discard)
		stdoutW.Close()
	}()
	lines := bufio.NewScanner(stdoutR)
	next := func() []lockJSON {
		t.Helper()
		require.True(t, lines.Scan(), "watch stopped printing: %v", lines.Err())
		var rows []lockJSON
		require.NoError(t, json.Unmarshal(lines.Bytes(), &rows), lines.Text())
		return rows
	}
	require.Empty(t, next())
	lease, err := newLessor(t, b.Pool, "watched").TryAcquire(b.Ctx, "cli:watched", time.Minute)
	require.NoError(t, err)
	defer lease.Release(b.Ctx)
	deadline := time.Now().Add(10 * time.Second)
	for rows := next(); len(rows) != 1 || rows[0].Resource != "cli:watched" || *rows[0].Token != int64(lease.Token()); rows = next() {
		require.True(t, time.Now().Before(deadline), "watch did not show the lease within 10s: %+v", rows)
	}
	_, err = io.WriteString(stdinW, "q\n")
	require.NoError(t, err)
	go io.Copy(io.Discard, stdoutR) // the refreshes until it sees the q
	select {
	case code := <-exited:
		require.Equal(t, cli.ExitOK, code)
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end within 10s of q")
	}
}

// watch, built and run in a tmux terminal: the header and "no locks held", then a lease as it
// is taken, then a single q (no Enter: the terminal is in cbreak mode) ends it with exit code 0.
func TestCLIWatchInTmux(t *testing.T) {
	t.Parallel()
	tmux := pgtest.LookProgram(t, "tmux", "apt-get install tmux")
	b := setup(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "fencelock")
	// go test puts its own GOROOT/bin first on the PATH of the test.
	build := exec.CommandContext(b.Ctx, "go", "build", "-o", bin, "github.com/fencelock/fencelock/cmd/fencelock")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	rc := filepath.Join(dir, "rc")
	script := filepath.Join(dir, "watch.sh")
	require.NoError(t, os.WriteFile(script, []byte(fmt.Sprintf("#!/bin/sh\nDATABASE_URL=%s %s watch --interval 200ms\necho $? > %s\n",
		shellQuote(b.DB.URL), shellQuote(bin), shellQuote(rc))), 0o755))

	// A server of its own, its socket in the test's directory (tmux -L would leave it in
	// /tmp/tmux-UID after kill-server).
	socket := filepath.Join(dir, "tmux.sock")
	tm := func(args ...string) (string, error) {
		// -u: the pane is UTF-8 whatever the locale; -f /dev/null: no user configuration.
		cmd := exec.CommandContext(b.Ctx, tmux, append([]string{"-u", "-S", socket, "-f", "/dev/null"}, args...)...)
		cmd.Env = append(envWithout("TMUX"), "TERM=xterm")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() { _, _ = tm("kill-server") })
	_, err = tm("new-session", "-d", "-x", "160", "-y", "40", "-s", "w", script)
	require.NoError(t, err)
	awaitPane := func(what string, ok func(pane string) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		var pane string
		for time.Now().Before(deadline) {
			p, err := tm("capture-pane", "-p", "-t", "w")
			if pane = p; err == nil && ok(pane) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("the pane did not show %s within 10s; it shows:\n%s", what, pane)
	}
	awaitPane("the header and no locks", func(p string) bool {
		return strings.Contains(p, "fencelock watch — ") && strings.Contains(p, "/"+b.DB.Name+" — ") &&
			strings.Contains(p, "— q to quit") && strings.Contains(p, "no locks held")
	})
	lease, err := newLessor(t, b.Pool, "worker-tmux").TryAcquire(b.Ctx, "cli:tmux-job", time.Minute)
	require.NoError(t, err)
	defer lease.Release(b.Ctx)
	awaitPane("the lease", func(p string) bool {
		return regexp.MustCompile(`(?m)^lease +cli:tmux-job +worker-tmux +` + strconv.FormatInt(int64(lease.Token()), 10) + ` `).MatchString(p)
	})

	_, err = tm("send-keys", "-t", "w", "q")
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := tm("has-session", "-t", "w"); err != nil {
			break // the script, and so the session, has ended
		}
		if time.Now().After(deadline) {
			pane, _ := tm("capture-pane", "-p", "-t", "w")
			t.Fatalf("watch did not exit within 10s of q; the pane shows:\n%s", pane)
		}
		time.Sleep(50 * time.Millisecond)
	}
	code, err := os.ReadFile(rc)
	require.NoError(t, err, "the script did not record watch's exit code")
	require.Equal(t, "0\n", string(code))
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// envWithout returns the environment without the variable name.
func envWithout(name string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, name+"=") {
			env = append(env, kv)
		}
	}
	return env
}
