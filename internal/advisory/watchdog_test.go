package advisory

import (
	"sync"
	"testing"
	"time"
)

// A round probes every lock at once: no probe waits for another to return.
func TestProbeAllRunsProbesAtOnce(t *testing.T) {
	const n = 5
	var started sync.WaitGroup
	started.Add(n)
	all := make(chan struct{})
	go func() { started.Wait(); close(all) }()
	seen := make(chan int, n)
	done := make(chan struct{})
	go func() {
		ProbeAll([]int{0, 1, 2, 3, 4}, func(i int) {
			started.Done()
			select {
			case <-all:
			case <-time.After(10 * time.Second):
				t.Errorf("probe %d waited for the others to return", i)
			}
			seen <- i
		})
		close(done)
	}()
	<-done
	close(seen)
	got := map[int]bool{}
	for i := range seen {
		got[i] = true
	}
	if len(got) != n {
		t.Fatalf("probed %v, want all %d", got, n)
	}
}

func TestPIDChangedErrorMessage(t *testing.T) {
	err := &PIDChangedError{Got: 7, Want: 5}
	if got, want := err.Error(), "the connection now reaches another backend (pid 7, was 5)"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}
