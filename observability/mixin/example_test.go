package mixin_test

import (
	"fmt"

	"github.com/idemkit/idempotency/observability/mixin"
)

// A dashboard for an application that exports its metrics under the
// namespace shop (observability.WithNamespace("shop")).
func ExampleDashboard() {
	data, err := mixin.Dashboard("shop")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(data) > 0)
	// Output: true
}
