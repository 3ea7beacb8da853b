package pgtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Tests that need an optional program (PgBouncer, Patroni and etcd, tmux) skip where it is
// missing, with a message that says how to install it, so that `go test ./...` passes on a fresh
// machine with PostgreSQL alone; under CI ([InCI]) a missing program fails the test instead,
// so that nothing is skipped there in silence.

// InCI reports whether the environment variable CI is set to a true value ("true", "1" or
// "yes", in any case), as CI services and fencelock's .ci/run set it. Safe for concurrent use.
func InCI() bool {
	switch strings.ToLower(os.Getenv("CI")) {
	case "true", "1", "yes":
		return true
	}
	return false
}

// missingProgram skips t with err's message (how to install the program) or, under CI ([InCI]),
// fails it. It does nothing when err is nil.
func missingProgram(t testing.TB, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if InCI() {
		t.Fatalf("%v (CI=%s: optional programs are required here)", err, os.Getenv("CI"))
		return // not reached under a *testing.T
	}
	t.Skipf("%v (skipped; with CI=true this fails)", err)
}

// LookProgram returns the path of the program name, found on PATH or in /usr/bin or /usr/sbin.
// Where it is missing, it skips t with a message that says to run install (for example
// "apt-get install tmux"), or, under CI ([InCI]), fails t. It is safe for concurrent use.
func LookProgram(t testing.TB, name, install string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/bin", "/usr/sbin"} {
		if p := filepath.Join(dir, name); executableFile(p) {
			return p
		}
	}
	missingProgram(t, &programError{name: name, install: install})
	return "" // not reached under a *testing.T: missingProgram skipped or failed t
}

// programError says that a program is missing and how to install it.
type programError struct{ name, install string }

func (e *programError) Error() string {
	return "pgtest: " + e.name + " not found on PATH nor in /usr/bin, /usr/sbin: install it (Debian, Ubuntu: " + e.install + ")"
}

// executableFile reports whether path is a regular file with an execute bit set.
func executableFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// NeedPgBouncer skips t, with a message saying to `apt-get install pgbouncer`, when the
// pgbouncer binary is missing, or, under CI ([InCI]), fails it. [NewPgBouncer] calls it; call
// it before [StartPgBouncer] in a test.
func NeedPgBouncer(t testing.TB) {
	t.Helper()
	_, err := findPgBouncer()
	missingProgram(t, err)
}

// NeedPatroni skips t, with a message saying to `apt-get install patroni etcd-server`, when
// patroni, patronictl or etcd is missing, or, under CI ([InCI]), fails it. [NewPatroni] calls
// it; call it before [StartPatroni] in a test.
func NeedPatroni(t testing.TB) {
	t.Helper()
	_, err := findPatroniPrograms()
	missingProgram(t, err)
}
