"""The capture process (`dblog run`): source stream -> snapshot window -> change log."""
