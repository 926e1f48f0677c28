"""The engine replica deployment and the one interface every engine backend implements."""
