package cli

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// quitKeys watches stdin for the operator's q. When stdin is a terminal it puts the terminal
// (/dev/tty) into cbreak mode with stty (-icanon -echo: each key arrives at once, unechoed;
// ctrl-C still signals) and reads keys from /dev/tty; otherwise it reads lines, and a line "q"
// quits. The returned channel closes at the first q; stop restores the terminal's settings and
// ends the reader. End of a non-terminal stdin does not quit: watch then runs until a signal.
func quitKeys(stdin io.Reader) (quit <-chan struct{}, stop func()) {
	q := make(chan struct{})
	var once sync.Once
	pressed := func() { once.Do(func() { close(q) }) }
	if t, ok := openTerminal(stdin); ok {
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]byte, 64)
			for {
				n, err := t.keys.Read(buf)
				if strings.ContainsAny(string(buf[:n]), "qQ") {
					pressed()
				}
				if err != nil {
					return
				}
			}
		}()
		return q, func() {
			if t.restore() {
				<-done
			}
		}
	}
	if stdin == nil {
		return q, func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		lines := bufio.NewScanner(stdin)
		for lines.Scan() {
			if strings.EqualFold(strings.TrimSpace(lines.Text()), "q") {
				pressed()
			}
		}
	}()
	return q, func() {
		// A reader with deadlines (a pipe or socket as *os.File, a net.Conn) is woken now; any
		// other ends with its input.
		if d, ok := stdin.(interface{ SetReadDeadline(time.Time) error }); ok && d.SetReadDeadline(time.Now()) == nil {
			<-done
		}
	}
}

// terminal is the controlling terminal in cbreak mode, until restore.
type terminal struct {
	ctl   *os.File // /dev/tty, the stdin of stty
	keys  *os.File // /dev/tty opened apart for reading: pollable, so Close ends a pending Read
	saved string   // stty -g before
}

// openTerminal puts the terminal into cbreak mode if stdin is one, with the stty program (the
// standard library has no termios calls), and opens it for reading keys. It reports false,
// changing nothing, when stdin is not a terminal or stty or /dev/tty is unavailable.
func openTerminal(stdin io.Reader) (*terminal, bool) {
	f, ok := stdin.(*os.File)
	if !ok {
		return nil, false
	}
	if fi, err := f.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return nil, false
	}
	if _, err := stty(f, "-g"); err != nil { // fails for /dev/null and other non-terminals
		return nil, false
	}
	ctl, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return nil, false
	}
	saved, err := stty(ctl, "-g")
	if err != nil {
		ctl.Close()
		return nil, false
	}
	keys, err := os.Open("/dev/tty")
	if err != nil {
		ctl.Close()
		return nil, false
	}
	if _, err := stty(ctl, "-icanon", "-echo", "min", "1", "time", "0"); err != nil {
		_, _ = stty(ctl, saved)
		keys.Close()
		ctl.Close()
		return nil, false
	}
	return &terminal{ctl: ctl, keys: keys, saved: saved}, true
}

// restore puts the terminal's settings back and ends the reading of keys. It reports whether
// a pending Read of keys was woken (always, where /dev/tty is pollable, as on Linux and the
// BSDs); if not, that Read ends at the next key or at exit.
func (t *terminal) restore() (woken bool) {
	_, _ = stty(t.ctl, t.saved)
	woken = t.keys.SetReadDeadline(time.Now()) == nil
	t.keys.Close()
	t.ctl.Close()
	return woken
}

// stty runs stty with args on the terminal tty and returns its output, trimmed.
func stty(tty *os.File, args ...string) (string, error) {
	cmd := exec.Command("stty", args...)
	cmd.Stdin = tty
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", errors.Join(err, errors.New(strings.TrimSpace(stderr.String())))
	}
	return strings.TrimSpace(string(out)), nil
}
