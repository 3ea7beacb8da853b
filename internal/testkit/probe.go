package testkit

import (
	"io"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

// StartChild starts cmd, a child process of the test (typically this test binary again), so
// that it cannot outlive the test binary: on Linux the kernel sends it SIGKILL when the test
// binary exits or is killed (a go test -timeout panic, a CI job cancelled), even while the
// child is stopped by SIGSTOP; elsewhere only a child that reads its stdin, a pipe the test
// holds, can notice the test's end. Its stderr goes to the test's unless cmd sets it. It
// fails the test when cmd does not start. The caller waits for the process (cmd.Wait).
func StartChild(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	dieWithTest(cmd)
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	// The parent-death signal comes when the thread that started the child ends: a new
	// goroutine is locked to no thread, and Go keeps its thread for the process's life.
	started := make(chan error, 1)
	go func() { started <- cmd.Start() }()
	require.NoError(t, <-started)
}

// StartPiped starts cmd as [StartChild] does, with pipes to its stdin and from its stdout,
// and returns the pipes. It fails the test when a pipe cannot be made or cmd does not start.
func StartPiped(t testing.TB, cmd *exec.Cmd) (stdin io.WriteCloser, stdout io.ReadCloser) {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err = cmd.StdoutPipe()
	require.NoError(t, err)
	StartChild(t, cmd)
	return stdin, stdout
}
