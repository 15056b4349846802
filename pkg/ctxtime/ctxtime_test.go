package ctxtime_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
)

func TestSleepWaitsOutItsDuration(t *testing.T) {
	start := time.Now()
	if err := ctxtime.Sleep(context.Background(), 20*time.Millisecond); err != nil {
		t.Fatalf("Sleep = %v, want nil", err)
	}
	if waited := time.Since(start); waited < 20*time.Millisecond {
		t.Fatalf("Sleep returned after %s, want at least 20ms", waited)
	}
}

func TestSleepEndsWithItsContext(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ctxtime.Sleep(ended, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep on an ended context = %v, want context.Canceled", err)
	}
	short, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := ctxtime.Sleep(short, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Sleep past its context's deadline = %v, want context.DeadlineExceeded", err)
	}
}
