"""Routes filled in by the serving issue (see issue 3)."""
from fastapi import APIRouter

router = APIRouter()
