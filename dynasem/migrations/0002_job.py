from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("dynasem", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Job",
            fields=[
                (
                    "id",
                    models.AutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
            ],
            options={
                "verbose_name": "run-once job",
                "verbose_name_plural": "run-once jobs",
                "permissions": [("reset_job", "Can reset a run-once job so that it runs again")],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
