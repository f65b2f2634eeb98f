package idempotency_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The frameworks of the adapters that are modules of their own stay out of
// the core's module graph: an app that uses the core alone never downloads,
// audits or upgrades them.
func TestCoreModuleGraphHasNoAdapterFramework(t *testing.T) {
	out, err := exec.Command("go", "mod", "graph").Output()
	if err != nil {
		t.Fatalf("go mod graph: %v", err)
	}
	graph := string(out)
	for _, m := range []string{
		"github.com/gin-gonic/gin", "github.com/labstack/echo/", "connectrpc.com/connect",
		"google.golang.org/grpc", "github.com/ThreeDotsLabs/watermill",
	} {
		for line := range strings.SplitSeq(graph, "\n") {
			if strings.Contains(line, " "+m) {
				t.Errorf("the core's module graph has %s: %s", m, line)
				break
			}
		}
	}
}
