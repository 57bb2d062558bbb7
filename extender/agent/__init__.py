"""Node agent: checkpoint -> verified transfer -> cutover -> restore -> confirm -> delete source; or roll back."""
