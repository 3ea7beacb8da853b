package testkit

import (
	"io"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

// StartPiped starts cmd (a child process the test talks to: typically this test binary again)
// with pipes to its stdin and from its stdout, its stderr going to the test's, and returns
// the pipes. It fails the test when a pipe cannot be made or cmd does not start.
func StartPiped(t testing.TB, cmd *exec.Cmd) (stdin io.WriteCloser, stdout io.ReadCloser) {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err = cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	return stdin, stdout
}
