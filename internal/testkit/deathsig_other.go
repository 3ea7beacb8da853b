//go:build !linux

package testkit

import "os/exec"

// dieWithTest does nothing outside Linux, which has no parent-death signal (see StartChild).
func dieWithTest(*exec.Cmd) {}
