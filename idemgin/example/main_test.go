// The tests are in package main because a main package cannot be imported.
// orderstest starts the whole app, as main builds it, and checks it over
// HTTP as it checks the Echo and gin examples alike.
package main

import (
	"testing"

	"github.com/idemkit/idempotency/idempg/example/orders/orderstest"
)

func TestMain(m *testing.M) { orderstest.Main(m, run) }

func TestOrderService(t *testing.T) { orderstest.Run(t, appOptions) }
