package idemkey_test

import (
	"fmt"

	"github.com/idemkit/idempotency/idemkey"
)

func ExampleScoped() {
	// The key that idemhttp and idemgrpc store for the client key
	// "order-42" of a caller whose WithKeyScope hook returned "shop_1".
	fmt.Println(idemkey.Scoped("shop_1", "order-42"))
	// Output: 6c5c138982bb9a55010eaa1cbc9b329c:order-42
}
